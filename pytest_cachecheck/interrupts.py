"""Signals while the plugin is on: SIGTERM (CI cancellation, ``timeout``, ``docker stop``) ends a run as
Ctrl-C does, and a later signal cannot stop the report from being written, make it look complete, or end
the process with another exit status than the one it records (short of a third one while it is written).

pytest turns SIGINT into KeyboardInterrupt; :class:`Interrupts` does the same for SIGTERM. On the process
that writes the report it also counts SIGINT, and after the first signal it *holds* later ones until the
report is written (``hold()`` around the writing does the same for a signal that comes in the middle of
it): a second Ctrl-C raised inside pytest's own handling of the first would end the session with exit
status 0 and probes listed as not run. A third signal during a hold is raised anyway, so a hung write can
still be abandoned. Once the report is written (a hold has ended), what it says is settled and pytest is
only tidying up: a signal outside a hold is then absorbed, so the process ends with the exit status the
report records and no traceback, wherever the signal lands (pytest's own unconfigure included).

``restore()``, once pytest is done, puts back the handlers found. After a signal, on the process that
writes the report, it keeps ours instead, to the end of the process (ignoring the signals from ``atexit``
on, as Python resets a handler to the default while it exits): pytest is ending an interrupted run. In
process (``pytest.main``, pytester's inline runs) that outlives the run; pytester raises the
KeyboardInterrupt again in the outer run, which then ends too. A handler someone else installed, or a
signal that is ignored, is left alone. Knows nothing about pytest.
"""

from __future__ import annotations

import atexit
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
        self._settled = False  # a hold has ended (or pytest is done): later signals are absorbed
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
        """When pytest is done: put back the handlers found at ``install``, where ours is still the one in
        place; on the process that writes the report, after a signal, keep ours to the end of the process."""
        if self.received and self._hold_after_first and self._installed:
            self._holding, self._settled = False, True
            atexit.register(self._ignore_from_now)
            return
        self._set_ours_to(self._installed)
        self._installed.clear()

    def _ignore_from_now(self) -> None:
        """At exit, ignore the signals ours handles: Python resets a handler to the default before the end."""
        self._set_ours_to({signum: signal.SIG_IGN for signum in self._installed})

    def _set_ours_to(self, handlers: Dict[int, Any]) -> None:
        for signum, handler in handlers.items():
            try:
                if signal.getsignal(signum) == self.handle:
                    signal.signal(signum, handler)
            except (ValueError, OSError):  # pragma: no cover
                pass

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
        # os.write: a signal handler must not re-enter a buffered stream the main thread is writing
        if self._holding and len(self.received) < ABANDON_AFTER:
            os.write(2, b"\ncachecheck: writing the report of the interrupted run first (another signal "
                        b"abandons it)\n")
            return
        if self._settled and not self._holding:
            os.write(2, b"\ncachecheck: pytest is ending the run: signal ignored\n")
            return
        self._holding = self._hold_after_first
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Hold signals while the report and the summary are written; absorb them afterwards."""
        self._holding = True
        try:
            yield
        finally:
            self._holding, self._settled = False, True
