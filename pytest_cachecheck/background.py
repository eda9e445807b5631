"""Background traffic: one measured request sent while plugin-generated background requests are in flight.

One rule for every kind measured under load (the batch kind, batch.py; the cache under load, the probe
protocol's turn-2 requests in protocol.py): the ``BatchShape.concurrent`` background requests
(``BatchShape.messages()``, the same for every probe and run) are sent at once, each on a thread of its
own, from scratch, on any free slot and answering their whole ``max_tokens`` (the client's ``scratch()``,
``unpinned()`` and ``no_early_stop()``); the measured request is sent ``lead_s`` after every one of them is
on its way, with its own fields; every background request has ended before :meth:`Background.around`
returns, so the next request is sent alone. What the client saw is a :class:`~pytest_cachecheck.model.LoadRun`;
whether the background was in flight when the measured request was sent is the load rule's to judge
(:func:`~pytest_cachecheck.validity.under_load`). A failed background request raises
:class:`BackgroundFailed`, a request error: the measurement is an error. Knows nothing about pytest.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

from .clients import ChatClient
from .errors import CachecheckError, RequestError
from .model import BatchShape, LoadRun
from .validity import Span, overlap

T = TypeVar("T")


class BackgroundFailed(RequestError):
    """A background request failed: the measurement is an error, named by the request."""


class Background:
    """The background traffic of ``shape`` on ``client``'s server."""

    def __init__(self, client: ChatClient, shape: BatchShape, beside_cache: bool = False) -> None:
        self.client = client
        self.shape = shape
        #: the cache under load: keep the background off the cache path's slot (``ChatClient.beside_cache``)
        self.beside_cache = beside_cache
        self._messages = shape.messages()

    def fields(self, i: int) -> Dict[str, Any]:
        """Background request ``i``'s cache and slot fields (asked for each: a fresh salt each): from scratch,
        on any free slot (or one beside the cache path's), its whole ``max_tokens``."""
        slot = self.client.beside_cache(i) if self.beside_cache else self.client.unpinned()
        return {**(self.client.scratch() or {}), **slot, **self.client.no_early_stop()}

    def around(self, run: int, measured: Callable[[], Tuple[T, Span]]) -> Tuple[T, LoadRun]:
        """Send the background, then ``measured`` (which sends the measured request and returns its result and
        :class:`~pytest_cachecheck.validity.Span`) ``lead_s`` after every background request is on its way;
        its result and the load run (numbered ``run``) once every background request has ended."""
        n = len(self._messages)
        spans: List[Optional[Span]] = [None] * n
        failures: List[Optional[Exception]] = [None] * n
        started = threading.Semaphore(0)
        def send(i: int) -> None:
            sent = time.monotonic()
            started.release()
            try:
                self.client.chat(self._messages[i], max_tokens=self.shape.max_tokens, cache=self.fields(i))
            except (CachecheckError, OSError) as exc:  # the HTTP layer raises RequestError; be sure
                failures[i] = exc
            spans[i] = Span(sent, time.monotonic())

        threads = [threading.Thread(target=send, args=(i,), name=f"cachecheck-batch-{i}", daemon=True)
                   for i in range(n)]
        first = time.monotonic()
        for t in threads:
            t.start()
        try:
            # every background request on its way first (a busy machine may start threads late), then the lead
            for _ in threads:
                started.acquire(timeout=60)
            time.sleep(self.shape.lead_s)
            result, span = measured()
        finally:
            for t in threads:  # the next request is sent alone: every background request has ended
                t.join()
        for i, failure in enumerate(failures):
            if failure is not None:
                raise BackgroundFailed(f"load run {run}: background request {i + 1} of {n} failed: {failure}")
        done = [s for s in spans if s is not None]
        at_send, at_answer = overlap(span, done)
        return result, LoadRun(run=run, background=n, in_flight_at_send=at_send, in_flight_at_answer=at_answer,
                               measured_s=span.answered - span.sent,
                               background_s=max(s.answered for s in done) - first)
