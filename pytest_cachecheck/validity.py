"""The validity rules, once, for every kind of measurement (a probe's two turns, an episode's steps).

A measurement is valid when the server's counters can be trusted (no impossible counts), each path repeats
on its own, every cache-path request after the first reused what the request before it left (its prompt +
answer - 1, within the tolerance, and past its prompt), the first cache-path request started clean, and no
recompute-path request reused anything. The batch measurement (batch.py) adds one rule, the load rule: a
request measured under load was sent while background requests were in flight (:func:`overlap`,
:func:`under_load`). The callers name the requests; the rules and their words are here. Knows nothing about
pytest or HTTP.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, List, Optional, Protocol, Sequence, Tuple, Type

from .errors import RequestError, ServerSetupError, WrongModel
from .model import Outcome

if TYPE_CHECKING:
    from .clients import ChatClient, Reply


class Counted(Protocol):
    """What the rules read of a request: the server's own token counters."""

    prompt_tokens: Optional[int]
    completion_tokens: Optional[int]
    cached_tokens: Optional[int]


class MissingCounter(ServerSetupError):
    """A reply without the cached-token counter, where the hit check needs it."""

    @classmethod
    def check(cls, reply: "Reply", where: str, client: "ChatClient", skip_hit_check: bool) -> None:
        """Raise when ``reply`` (of the request ``where`` names) lacks the counter and the hit is checked."""
        if reply.cached_tokens is None and not skip_hit_check:
            raise cls(f"{where}: the server at {client.http.shown} did not report cached tokens "
                      f"(usage.prompt_tokens_details.cached_tokens is missing), so cache use cannot be checked; "
                      f"turn reporting on with {client.reporting_flag}")


def wrong_model_reason(exc: WrongModel) -> str:
    """A probe or episode answered under another model name measured another model: inconclusive."""
    return f"inconclusive: {exc}"


@contextmanager
def settled(record: Any, scrub: Callable[[str], str], also: Tuple[Type[BaseException], ...] = ()) -> Iterator[None]:
    """Measure inside this: a failed request (or a server that cannot be measured, or ``also``) makes the
    record an error, never a divergence; an answer under another model's name makes it inconclusive. The
    reason is scrubbed of secrets."""
    try:
        yield
    except WrongModel as exc:
        record.outcome, record.reason = Outcome.INCONCLUSIVE, scrub(wrong_model_reason(exc))
    except (RequestError, ServerSetupError, *also) as exc:
        record.outcome, record.reason = Outcome.ERROR, scrub(str(exc))


def impossible_counts(reply: Counted) -> List[str]:
    """What a reply's counters say that cannot be: negative counts, more cached tokens than the prompt."""
    out = [f"{name} {value}" for name, value in (("prompt_tokens", reply.prompt_tokens),
                                                 ("completion_tokens", reply.completion_tokens),
                                                 ("cached_tokens", reply.cached_tokens))
           if value is not None and value < 0]
    if reply.cached_tokens is not None and reply.prompt_tokens is not None \
            and reply.cached_tokens > reply.prompt_tokens >= 0:
        out.append(f"cached_tokens {reply.cached_tokens} above prompt_tokens {reply.prompt_tokens}")
    return out


def untrusted(named: Sequence[Tuple[str, Counted]], limit: Optional[int] = None) -> Optional[str]:
    """The inconclusive reason when any request's counters are impossible (then nothing else is read)."""
    found = [f"{name}: {', '.join(bad)}" for name, reply in named for bad in [impossible_counts(reply)] if bad]
    if not found:
        return None
    return ("inconclusive: the server reported impossible token counts, so its cache counters cannot be trusted: "
            + "; ".join(found[:limit]))


def inconclusive(problems: Sequence[str], limit: Optional[int] = None) -> str:
    """The reason of a measurement the rules found invalid, with at most ``limit`` problems spelled out."""
    shown = list(problems[:limit])
    more = len(problems) - len(shown)
    return "inconclusive: " + "; ".join(shown) + (f"; and {more} more" if more else "")


def differs(what: str, at: Optional[int], unit: str) -> Optional[str]:
    """The repeat rule: a path whose two runs part at ``at`` (a character, a step) did not repeat."""
    return None if at is None else f"{what} (from {unit} {at})"


@dataclass(frozen=True)
class Hit:
    """A hit the rules found short, as words: ``short`` (below what it had to reach) or not past the prompt."""

    short: bool
    text: str


@dataclass(frozen=True)
class Rules:
    """The rules with this measurement's tolerance, hit-check switch and clean-start expectation."""

    tolerance: int
    skip_hit_check: bool
    clean_start: bool

    @staticmethod
    def full(earlier: Counted) -> int:
        """All a hit after ``earlier`` can reuse: its prompt and answer, less the answer's last token."""
        assert earlier.prompt_tokens is not None and earlier.completion_tokens is not None
        return earlier.prompt_tokens + earlier.completion_tokens - 1

    def need(self, earlier: Counted) -> int:
        """The least hit the request after ``earlier`` must report."""
        return max(self.full(earlier) - self.tolerance, 0)

    def hit(self, what: str, cached: Optional[int], earlier: Counted, name: str, prompt: str) -> Optional[Hit]:
        """The hit rule for a cache-path request after ``earlier`` (called ``name``; its prompt ``prompt``)."""
        if self.skip_hit_check:
            return None
        assert earlier.prompt_tokens is not None
        cached = cached or 0
        need = self.need(earlier)
        if cached < need:
            return Hit(True, f"{what} was {cached} tokens, expected at least {need} ({name} prompt "
                             f"{earlier.prompt_tokens} + answer {earlier.completion_tokens} - 1 - tolerance "
                             f"{self.tolerance})")
        if cached <= earlier.prompt_tokens:
            return Hit(False, f"{what} was {cached} tokens, not past {prompt} ({earlier.prompt_tokens} tokens)")
        return None

    def stops_inside(self, cached: Optional[int], earlier: Counted) -> bool:
        """Whether a short hit still reached past ``earlier``'s prompt into its answer."""
        assert earlier.prompt_tokens is not None
        return earlier.prompt_tokens - self.tolerance - 1 < (cached or 0) < self.need(earlier)

    def clean(self, where: str, cached: Optional[int]) -> Optional[str]:
        """The first cache-path request must start from a clean state (when the mode can tell)."""
        if self.clean_start and cached:
            return f"{where} reused {cached} cached tokens; it must start from a clean state"
        return None

    @staticmethod
    def no_reuse(where: str, cached: Optional[int]) -> Optional[str]:
        """A recompute-path request must reuse nothing."""
        return f"{where} reused {cached} cached tokens, expected 0" if cached else None


@dataclass(frozen=True)
class Span:
    """When the client sent a request and when its answer (or failure) came, by ``time.monotonic()``."""

    sent: float
    answered: float


def overlap(measured: Span, background: Sequence[Span]) -> Tuple[int, int]:
    """(background requests in flight when ``measured`` was sent, those of them still in flight when it was
    answered), by the client's clock: sent before it, answered after it was sent (or after it was
    answered)."""
    at_start = [b for b in background if b.sent < measured.sent < b.answered]
    return len(at_start), sum(1 for b in at_start if b.answered >= measured.answered)


def under_load(where: str, in_flight: int, background: int) -> Optional[str]:
    """The load rule: a request measured under load must have been sent while at least one background request
    was in flight, so the server had other work when it arrived. Whether the server then ran it beside that
    work (a batch) or queued it until a slot was free (computed alone, as with llama-server ``-np 1``) is the
    server's behaviour under load, which is what is measured; it is not asked that the background outlast
    it."""
    if in_flight:
        return None
    return (f"{where}: none of the {background} background requests was in flight when it was sent (they "
            f"ended first); give them more tokens to answer")
