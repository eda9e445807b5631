"""Signals while the plugin is on: SIGTERM (CI cancellation, ``timeout``, ``docker stop``) ends a run as
Ctrl-C does, and a second signal while pytest is ending an interrupted run cannot stop the report from
being written or make it look complete.

pytest turns SIGINT into KeyboardInterrupt; :class:`Interrupts` does the same for SIGTERM. On the process
that writes the report it also counts SIGINT, and after the first signal it *holds* later ones until the
report is written (``hold()`` around the writing does the same for a signal that comes in the middle of
it): a second Ctrl-C raised inside pytest's own handling of the first would end the session with exit
status 0 and probes listed as not run. A third signal during a hold is raised anyway, so a hung write can
still be abandoned. A handler someone else installed, or a signal that is ignored, is left alone.
Knows nothing about pytest.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any, Dict, Iterator, List, Tuple

ABANDON_AFTER = 3  # the signal that is raised even while the report is being written


class Interrupts:
    def __init__(self, *, hold_after_first: bool) -> None:
        #: names of the signals received, in order
        self.received: List[str] = []
        self._hold_after_first = hold_after_first
        self._holding = False
        self._installed: Dict[int, Any] = {}

    def install(self, *, sigint: bool) -> None:
        """Handle SIGTERM (and, with ``sigint``, SIGINT) where the default handler is in place."""
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may set handlers (an xdist worker run in a thread)
        wanted: List[Tuple[int, Any]] = [(signal.SIGTERM, signal.SIG_DFL)]
        if sigint:
            wanted.append((signal.SIGINT, signal.default_int_handler))
        for signum, default in wanted:
            try:
                if signal.getsignal(signum) is default:
                    self._installed[signum] = signal.signal(signum, self.handle)
            except (ValueError, OSError):  # pragma: no cover - a platform without the signal
                pass

    def restore(self) -> None:
        """Put back the handlers found at ``install``, where ours is still the one in place."""
        for signum, previous in self._installed.items():
            try:
                if signal.getsignal(signum) == self.handle:
                    signal.signal(signum, previous)
            except (ValueError, OSError):  # pragma: no cover
                pass
        self._installed.clear()

    @property
    def interrupted(self) -> bool:
        return bool(self.received)

    def describe(self) -> str:
        """How the run was interrupted, for the verdict: 'by SIGTERM', '(Ctrl-C)' or ''."""
        if not self.received:
            return ""
        return "(Ctrl-C)" if self.received[0] == "SIGINT" else f"by {self.received[0]}"

    def handle(self, signum: int, frame: Any) -> None:
        __tracebackhide__ = True  # pytest shows where the run was, not this handler
        self.received.append(signal.Signals(signum).name)
        if self._holding and len(self.received) < ABANDON_AFTER:
            # os.write: a signal handler must not re-enter a buffered stream the main thread is writing
            os.write(2, b"\ncachecheck: writing the report of the interrupted run first (another signal "
                        b"abandons it)\n")
            return
        self._holding = self._hold_after_first
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Hold signals while the report and the summary are written; release them afterwards."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
