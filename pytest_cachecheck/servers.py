"""The server setup of a run, resolved and checked once before its first probe: which kind of server
answers at each URL, the mode, the hit tolerance its cache blocks call for, and whether anything in the
setup would spoil the measurement (then every probe of it errors with the fix named).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Type

from .checks import run_checks
from .clients import ChatClient, Http, detect_server
from .errors import ServerSetupError, WrongModel
from .model import Setup
from .redact import Redactor, display_url
from .settings import Settings
from .text import printable


@dataclass
class ServerSetup:
    """The resolved setup: mode, the caching server's client, the recompute server's (two-servers)."""

    mode: str
    cache: ChatClient
    nocache: Optional[ChatClient]
    hit_tolerance: Optional[int] = None  # None: as configured; set from the server's block size
    checked: bool = False  # whether the setup checks that send requests have run
    warnings: List[str] = field(default_factory=list)  # setup findings that do not stop the run
    notes: List[str] = field(default_factory=list)  # what those checks saw

    def describe(self) -> Setup:
        return Setup(mode=self.mode, server=self.cache.info.describe(),
                     nocache_server=self.nocache.info.describe() if self.nocache is not None else None,
                     hit_tolerance=self.hit_tolerance, setup_warnings=list(self.warnings),
                     setup_checks=list(self.notes))

    def tolerance(self, configured: int) -> int:
        return self.hit_tolerance if self.hit_tolerance is not None else configured

    def check(self, skip_hit_check: bool) -> None:
        """Run the setup checks that send requests; raises ServerSetupError when one finds a problem."""
        self.checked = True
        try:
            found = run_checks(self.cache, self.nocache, skip_hit_check)
        except WrongModel as exc:
            raise ServerSetupError(f"the server setup would spoil the measurement: {exc}") from None
        self.warnings, self.notes = [*self.warnings, *found.warnings], found.notes
        if found.problems:
            raise ServerSetupError("the server setup would spoil the measurement: " + "; ".join(found.problems))


def problems(mode: str, cache: ChatClient, nocache: Optional[ChatClient]) -> List[str]:
    """What the servers said about themselves that would spoil the measurement, each with its fix."""
    found = cache.setup_problems()
    if cache.prefix_caching() is False and mode == "one-server":
        found.append(f"prefix caching is off on the {cache.kind} server under test; start it without "
                     f"--no-enable-prefix-caching / --disable-radix-cache")
    if nocache is not None:
        if nocache.prefix_caching() is True:
            found.append(f"the nocache server ({nocache.kind}) reports prefix caching on: both URLs may reach the "
                         f"same server (a proxy or port forward), or start the second server with "
                         f"--no-enable-prefix-caching (vLLM) or --disable-radix-cache (SGLang)")
        a, b = cache.info.model, nocache.info.model
        if cache.names_model and nocache.names_model and a and b and a != b:
            found.append(f"the two servers serve different models ({printable(repr(a), 120)} and "
                         f"{printable(repr(b), 120)}); serve the same model on both")
    return found


def resolve(settings: Settings, redactor: Redactor, kinds: Sequence[Type[ChatClient]] = ()) -> ServerSetup:
    """Detect the servers (``kinds``: a plugin's client classes, tried first) and resolve the mode and
    tolerance. Sends nothing that generates. Raises RequestError or ServerSetupError."""
    s = settings
    cache = detect_server(_http(s, s.url, redactor), s.model, kinds=kinds)
    mode = s.mode
    if mode == "auto":
        mode = "llama.cpp" if cache.kind == "llama.cpp" else "one-server"
    if mode == "llama.cpp" and cache.kind != "llama.cpp":
        raise ServerSetupError(f"--cachecheck-mode llama.cpp, but {display_url(s.url)} does not answer like "
                               f"llama-server (no /props); it looks like {cache.kind}")
    if mode == "one-server" and cache.kind == "llama.cpp":
        raise ServerSetupError("--cachecheck-mode one-server needs a server that honours cache_salt (vLLM, "
                               "SGLang); llama-server has none: use --cachecheck-mode llama.cpp")
    nocache = None
    if mode == "two-servers":
        assert s.nocache_url is not None
        nocache = detect_server(_http(s, s.nocache_url, redactor), s.model, prefer=cache.info.model,
                                kinds=kinds)
    found = problems(mode, cache, nocache)
    warnings = []
    shared = getattr(cache, "shared_slots", lambda: None)() if s.batch is not None else None
    if shared in found:  # the batch kind needs several slots: with one it measures queueing
        found.remove(shared)
        warnings.append(f"{shared}; kept as a warning because --cachecheck-batch needs several slots to "
                        f"batch requests (with one, requests queue and nothing is batched): the probes' own "
                        f"validity rules still catch a stolen cache state (the cache hit must cover turn 1, "
                        f"else the probe is inconclusive)")
    few = fewer_slots(cache.info.details.get("total_slots") if cache.kind == "llama.cpp" else None, s.batch)
    if few:
        warnings.append(few)
    tolerance = s.hit_tolerance
    block = cache.block_size()
    if block is not None and block - 1 > tolerance:
        if s.hit_tolerance_given:
            found.append(f"the server caches in blocks of {block} tokens, so hits are rounded down by up to "
                         f"{block - 1}; --cachecheck-hit-tolerance {tolerance} is too small (use at least "
                         f"{block - 1})")
        else:
            tolerance = block - 1
    if found:
        raise ServerSetupError("the server setup would spoil the measurement: " + "; ".join(found))
    return ServerSetup(mode, cache, nocache, tolerance if tolerance != s.hit_tolerance else None,
                       warnings=warnings)


def fewer_slots(slots: Any, batch: Optional[int]) -> Optional[str]:
    """The batch kind's warning when the server computes fewer requests at once than it sends (the background
    and the measured one): the measured request then waits for a slot and is batched with fewer requests than
    asked for, or with none (one slot: the negative control). None when the slot count is unknown."""
    if batch is None or not isinstance(slots, int) or isinstance(slots, bool) or slots > batch:
        return None
    with_ = "nothing: it is computed alone (the one-slot negative control)" if slots == 1 else \
        f"at most {slots - 1} of them"
    return (f"llama-server runs {slots} slot{'s' if slots != 1 else ''}, so with --cachecheck-batch {batch} the "
            f"measured request waits for a slot and is batched with {with_}; start it with -np {batch + 1} or more "
            f"to batch it with all {batch}")


def _http(settings: Settings, url: str, redactor: Redactor) -> Http:
    __tracebackhide__ = True  # ``url`` may hold credentials
    return Http(url, api_key=settings.api_key, timeout=settings.timeout, redactor=redactor)
