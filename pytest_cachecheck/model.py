"""The result model: what one probe measured, what one target and the whole run came to, as typed
dataclasses written and read by one generic writer and reader (:class:`_Json`): a field's JSON form is
declared where the field is (:func:`_j`, :func:`_derived`), so adding a field is one line.

Every writer (terminal, JSON report, HTML page, baseline comparison) reads these objects; the JSON form
is ``SCHEMA_VERSION`` 2 (``RunReport.from_json`` also reads 1). ``RunReport.from_json`` also reads a
baseline file, and its errors name the field that is wrong. Nothing here knows pytest or HTTP.
"""

from __future__ import annotations

import functools
import random
from dataclasses import MISSING, Field, dataclass, field, fields
from enum import Enum
from typing import (Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Type, TypeVar, Union,
                    get_args, get_origin, get_type_hints)

from . import __version__
from .stats import mcnemar_exact, wilson
from .text import printable

SCHEMA_VERSION = 2
READ_VERSIONS = (1, 2)  # what RunReport.from_json reads
TOOL = "pytest-cachecheck"
#: a divergence is a near-tie when, at the first differing token, the two paths' top-1 minus top-2 margins add
#: up to at most this: swapping two tokens between the paths needs their logit difference to move by the sum
#: of the margins, and servers that compute or report logprobs in bfloat16 do so in steps of 0.125 nats.
NEAR_TIE_NATS = 0.125


class _Word(str, Enum):
    """An enum whose members are their JSON words."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Outcome(_Word):
    SAME = "same"
    DIFFERENT = "different"
    INCONCLUSIVE = "inconclusive"
    ERROR = "error"

    @property
    def valid(self) -> bool:
        return self in (Outcome.SAME, Outcome.DIFFERENT)


class Status(_Word):
    """A verdict: of the session, of one target, or written in a report's summary."""

    PASSED = "passed"
    DIVERGED = "diverged"  # a valid probe differed
    GATE_FAILED = "gate-failed"  # --cachecheck-max-rate or the baseline policy failed the run
    ERRORS = "errors"  # a probe failed with a request or server error
    TOO_FEW_VALID = "too-few-valid"
    UNRELIABLE = "unreliable"  # two processes sent to one server: nothing can be trusted
    NOT_MEASURED = "not-measured"  # a selected probe or episode ended without a record (a timeout, a crash, -x)
    UNWRITTEN = "report-not-written"  # the run measured, but an output file could not be written
    INTERRUPTED = "interrupted"
    NO_PROBES = "no-probes"


def shown(value: Any, limit: int = 80) -> str:
    """A server-supplied value as it may be shown: on one line, inert in a terminal, at most ``limit``."""
    return printable(str(value), limit)


def record_key(probe_id: str, target: Optional[str]) -> str:
    """How a probe is named among the session's records: its id, in a target matrix ``<id>@<target>``
    (target names cannot contain '@')."""
    return probe_id if target is None else f"{probe_id}@{target}"


class ReportError(ValueError):
    """A JSON report (a baseline) that cannot be read; the message names the field."""


# -- JSON: one writer and one reader over the dataclasses ----------------------------------------------------
class _Field:
    """A value of a JSON document and its path, for typed reads with clear errors."""

    def __init__(self, value: Any, path: str) -> None:
        self.value = value
        self.path = path

    def fail(self, expected: str) -> ReportError:
        got = type(self.value).__name__ if self.value is not None else "null"
        return ReportError(f"field '{self.path}': expected {expected}, got {got}")

    def __getitem__(self, key: str) -> "_Field":
        if not isinstance(self.value, dict):
            raise self.fail("an object")
        return _Field(self.value.get(key), f"{self.path}.{key}" if self.path else key)

    def items(self) -> List["_Field"]:
        if not isinstance(self.value, list):
            raise self.fail("a list")
        return [_Field(v, f"{self.path}[{i}]") for i, v in enumerate(self.value)]

    def string(self) -> str:
        if not isinstance(self.value, str):
            raise self.fail("a string")
        return self.value

    def integer(self) -> int:
        if isinstance(self.value, bool) or not isinstance(self.value, int):
            raise self.fail("a whole number")
        return self.value

    def number(self) -> float:
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)):
            raise self.fail("a number")
        return float(self.value)

    def boolean(self) -> bool:
        if not isinstance(self.value, bool):
            raise self.fail("true or false")
        return self.value

    def mapping(self) -> Dict[str, Any]:
        if self.value is None:
            return {}
        if not isinstance(self.value, dict):
            raise self.fail("an object")
        return self.value


def _word(cls: Any, f: _Field) -> Any:
    text = f.string()
    try:
        return cls(text)
    except ValueError:
        raise ReportError(f"field '{f.path}': unknown value {text!r}; expected one of "
                          + ", ".join(m.value for m in cls)) from None


_UNSET = object()  # no ``missing`` value


@dataclass(frozen=True)
class _Spec:
    key: Optional[str] = None
    missing: Any = _UNSET
    write: Any = True  # False, or a function of the value
    read: Any = True  # False (the field keeps its default), or a function of the object's _Field
    omit: bool = False
    flat: Optional[Mapping[str, str]] = None


_PLAIN = _Spec()
F = TypeVar("F", bound=Callable[..., Any])
J = TypeVar("J", bound="_Json")


def _j(*, key: Optional[str] = None, missing: Any = _UNSET, write: Any = True, read: Any = True,
       omit: bool = False, flat: Optional[Mapping[str, str]] = None, **default: Any) -> Any:
    """A dataclass field (``default=`` / ``default_factory=`` as ``field``) and its JSON form: ``key``, its
    name; ``missing``, its value when the JSON has null or lacks it (else the field's default; else a list
    or an object reads as empty and an optional value as None; else the reader refuses it); ``write`` and
    ``read``: False to skip, or a function (``read`` gets the object's :class:`_Field`); ``omit``: left out
    when None or empty; ``flat``: a nested record written into this object, its keys renamed as mapped."""
    return field(metadata={"json": _Spec(key, missing, write, read, omit, flat)}, **default)


def _derived(after: Optional[str] = None, key: Optional[str] = None, omit: bool = False) -> Callable[[F], F]:
    """Marks a property's getter (``@property`` goes above) as a value the writer adds after the field
    ``after`` (at the end when None), under ``key`` (default: its name); ``omit``: left out when None.
    Derived values are never read back."""
    def mark(get: F) -> F:
        get.__json__ = (after, key or get.__name__, omit)  # type: ignore[attr-defined]
        return get
    return mark


def _encode(value: Any) -> Any:
    if isinstance(value, _Json):
        return value.to_json()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


def _put(out: Dict[str, Any], key: str, value: Any, omit: bool) -> None:
    if not (omit and (value is None or (isinstance(value, list) and not value))):
        out[key] = _encode(value)


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> Dict[str, Any]:
    return get_type_hints(cls)


def _optional(tp: Any) -> bool:
    return get_origin(tp) is Union and type(None) in get_args(tp)


def _typed(tp: Any, f: _Field) -> Any:
    """``f`` read as the type ``tp`` says, or a ReportError naming its path."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Union:
        return _typed(next(a for a in args if a is not type(None)), f)
    if origin is list:
        return [_typed(args[0], item) for item in f.items()]
    if origin is dict:
        return {k: v for k, v in f.mapping().items() if args[1] is Any or type(v) is args[1]}
    if tp is Any:
        return f.value
    if issubclass(tp, Enum):
        return _word(tp, f)
    if issubclass(tp, _Json):
        return tp._read(f)
    return {str: f.string, int: f.integer, float: f.number, bool: f.boolean}[tp]()


def _value(tp: Any, f: _Field, fl: "Field[Any]", spec: _Spec) -> Any:
    if f.value is None or (_optional(tp) and f.value == {}):
        if spec.missing is not _UNSET:
            return spec.missing
        if fl.default is not MISSING:
            return fl.default
        if fl.default_factory is not MISSING:
            return fl.default_factory()
        if _optional(tp):
            return None
        if get_origin(tp) in (list, dict):
            return get_origin(tp)()
    return _typed(tp, f)


class _Json:
    """The JSON writer and reader of a dataclass, driven by its fields (:func:`_j`) and its derived values
    (:func:`_derived`). Records are constructed with keywords only."""

    def to_json(self) -> Dict[str, Any]:
        derived: Dict[Optional[str], List[Tuple[str, bool, Callable[[Any], Any]]]] = {}
        for klass in reversed(type(self).__mro__):
            for attr in vars(klass).values():
                mark = getattr(getattr(attr, "fget", None), "__json__", None)
                if mark is not None:
                    derived.setdefault(mark[0], []).append((mark[1], mark[2], attr.fget))
        out: Dict[str, Any] = {}
        for fl in [*fields(self), None]:  # type: ignore[arg-type]
            if fl is not None:
                spec: _Spec = fl.metadata.get("json", _PLAIN)
                value = getattr(self, fl.name)
                if spec.flat is not None:
                    out.update({spec.flat.get(k, k): v for k, v in value.to_json().items()})
                elif spec.write:
                    _put(out, spec.key or fl.name, value if spec.write is True else spec.write(value), spec.omit)
            for key, omit, get in derived.get(fl.name if fl is not None else None, ()):
                _put(out, key, get(self), omit)
        return out

    @classmethod
    def _read(cls: Type[J], f: _Field, keys: Mapping[str, str] = {}) -> J:
        if not isinstance(f.value, dict):
            raise f.fail("an object")
        hints, values = _hints(cls), {}
        for fl in fields(cls):  # type: ignore[arg-type]
            spec: _Spec = fl.metadata.get("json", _PLAIN)
            if spec.flat is not None:
                values[fl.name] = hints[fl.name]._read(f, {**keys, **spec.flat})
            elif callable(spec.read):
                values[fl.name] = spec.read(f)
            elif spec.read:
                name = spec.key or fl.name
                values[fl.name] = _value(hints[fl.name], f[keys.get(name, name)], fl, spec)
        return cls(**values)

    @classmethod
    def from_json(cls: Type[J], data: Any, path: str = "") -> J:
        """Read a record written by ``to_json``; raises ReportError naming the field that is wrong."""
        return cls._read(_Field(data, path))


# -- one probe ------------------------------------------------------------------------------------------
@dataclass
class ServerDescription(_Json):
    """What a server said about itself."""

    kind: str = _j(missing="?")  # llama.cpp | vllm | sglang | openai
    build: Optional[str] = None
    model: Optional[str] = None
    details: Dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        """``kind build model`` for tables, each part as it may be shown (a server's strings are untrusted)."""
        return " ".join(shown(x) for x in (self.kind, self.build, self.model) if x) or "?"


@dataclass
class Setup(_Json):
    """The resolved server setup as the measuring process saw it: mode, servers, tolerance, checks."""

    mode: Optional[str]
    server: Optional[ServerDescription]
    hit_tolerance: Optional[int] = None  # set when raised to the server's block size - 1
    setup_warnings: List[str] = field(default_factory=list)
    setup_checks: List[str] = field(default_factory=list)
    nocache_server: Optional[ServerDescription] = _j(default=None, omit=True)


@dataclass
class Request(_Json):
    """One request of a probe and what the server said (the report keeps no logprobs)."""

    step: str  # cache-1/turn-1, cache-1/turn-2, ..., recompute-2/turn-2
    server: str = _j(missing="cache")  # "cache" or "nocache"
    content: str = _j(missing="")
    finish_reason: Optional[str]
    prompt_tokens: Optional[int]
    completion_tokens: Optional[int]
    cached_tokens: Optional[int]
    reasoning_chars: int = 0


@dataclass
class Divergence(_Json):
    """Where the cache and recompute answers part, and how sure each path was there."""

    char: int
    token: Optional[int]
    cache_excerpt: str = _j(missing="")
    recompute_excerpt: str = _j(missing="")
    cache_token: Optional[str] = None
    recompute_token: Optional[str] = None
    cache_margin: Optional[float] = None
    recompute_margin: Optional[float] = None

    @property
    @_derived()
    def kind(self) -> Optional[str]:
        """``near-tie`` (the margins add up to at most NEAR_TIE_NATS), ``large-gap`` (at least one path was
        sure), or None without margins."""
        if self.cache_margin is None or self.recompute_margin is None:
            return None
        return "near-tie" if self.cache_margin + self.recompute_margin <= NEAR_TIE_NATS else "large-gap"

    @property
    @_derived()
    def near_tie_threshold(self) -> float:
        return NEAR_TIE_NATS

    def anatomy(self, sides: Tuple[str, str] = ("cache", "recompute"), large_gap: str = "") -> Optional[str]:
        """``token 3: cache 'a' vs recompute 'b'; top-2 logprob margin ... nats: near-tie``, the two sides named
        by ``sides`` (the batch kind's are "alone" and "load"), and ``large_gap`` (what a large gap means for
        this kind of measurement) added after a large gap; None without both tokens."""
        if self.cache_token is None or self.recompute_token is None:
            return None
        a, b = sides
        text = f"token {self.token}: {a} {self.cache_token!r} vs {b} {self.recompute_token!r}"
        if self.kind is not None:
            assert self.cache_margin is not None and self.recompute_margin is not None
            text += (f"; top-2 logprob margin {self.cache_margin:.4f} ({a}) and {self.recompute_margin:.4f} "
                     f"({b}) nats: {self.kind}")
            if self.kind == "large-gap" and large_gap:
                text += f"\n  {large_gap}"
        return text


@dataclass
class HitCheck(_Json):
    """One cache run's turn-2 hit against what it had to reach."""

    run: int
    cached_tokens: Optional[int]
    turn1_prompt_tokens: int
    turn1_answer_tokens: int
    expected_at_least: int
    full_reuse: int


@dataclass
class Checks(_Json):
    """What the validity rules read: the tolerance, each cache run's hit, whether recompute reused."""

    hit_tolerance: int = _j(missing=0)
    skip_hit_check: bool = _j(missing=False)
    cache_hits: List[HitCheck] = field(default_factory=list)
    recompute_reused: bool = False


CACHE_FAILS = "cache-fails"  # a flip: the recompute path passes its checks, the cache path fails them
CACHE_PASSES = "cache-passes"  # a flip the other way


@dataclass
class CheckResult(_Json):
    """One path's result on an item's outcome checks (``expect``, or a test's judge)."""

    passed: Optional[bool]  # None: the check itself failed (a test's judge raised), which is never a flip
    reason: str = ""  # when it did not pass: the first failing check and why


@dataclass
class CheckResults(_Json):
    """An item's outcome checks and their result on each path (none when the item was not valid)."""

    checks: List[str]  # each check as described
    cache: Optional[CheckResult] = None
    recompute: Optional[CheckResult] = None

    @property
    @_derived()
    def flip(self) -> Optional[str]:
        """``cache-fails`` or ``cache-passes`` when the paths' results differ (both evaluated), else None."""
        a, b = self.cache, self.recompute
        if a is None or b is None or a.passed is None or b.passed is None or a.passed == b.passed:
            return None
        return CACHE_FAILS if b.passed else CACHE_PASSES
    @property
    def error(self) -> Optional[str]:
        """Why a check could not be evaluated (a judge raised), else None."""
        return next((r.reason for r in (self.cache, self.recompute) if r is not None and r.passed is None), None)

    def flip_text(self) -> Optional[str]:
        """``outcome flipped: the cache path fails `contains 'x'` (why); the recompute path passes``."""
        flip = self.flip
        if flip is None:
            return None
        assert self.cache is not None and self.recompute is not None
        failing, passing = ("cache", "recompute") if flip == CACHE_FAILS else ("recompute", "cache")
        why = (self.cache if flip == CACHE_FAILS else self.recompute).reason
        return f"outcome flipped: the {failing} path fails {why}; the {passing} path passes"


ANSWER_STEPS = {"turn1": ("cache-1/turn-1", "cache-2/turn-1"), "cache": ("cache-1/turn-2", "cache-2/turn-2"),
                "recompute": ("recompute-1/turn-2", "recompute-2/turn-2")}
#: the JSON form of a record's duration
_SECONDS = _j(default=0.0, write=lambda s: round(s, 3))


class _Measured(_Json):
    """What a probe's and an episode's record share: the key they go by, and their outcome read out."""

    id: str
    target: Optional[str]
    outcome: Outcome

    @property
    def key(self) -> str:
        return record_key(self.id, self.target)

    @property
    def valid(self) -> bool:
        return self.outcome.valid

    @property
    def same(self) -> bool:
        return self.outcome == Outcome.SAME

    @property
    def flip(self) -> Optional[str]:
        """``cache-fails`` / ``cache-passes`` when the cache flipped the outcome of the item's checks."""
        results: Optional[CheckResults] = getattr(self, "check_results", None)
        return results.flip if results is not None else None

    @property
    def flipped(self) -> bool:
        return self.flip is not None

    def message(self) -> str:
        """The text a user sees for this outcome: a flip first, then the reason."""
        results: Optional[CheckResults] = getattr(self, "check_results", None)
        flip = results.flip_text() if results is not None else None
        reason: str = getattr(self, "reason", "")
        return f"{flip}\n{reason}" if flip and reason else flip or reason


@dataclass
class ProbeRecord(_Measured):
    """One probe's measurement: outcome, why, the divergence, every request, and where it ran.

    ``cachecheck.check()`` returns one of these (``.valid``, ``.same``, ``.different``, ``.reason``,
    ``.cache_answer``, ``.recompute_answer``, ``.message()``).
    """

    id: str
    source: str = _j(missing="")
    fingerprint: str = _j(missing="")
    outcome: Outcome
    reason: str = ""
    divergence: Optional[Divergence] = None
    checks: Optional[Checks] = _j(default=None, write=lambda c: c if c is not None else {})
    requests: List[Request] = field(default_factory=list)
    duration_s: float = _SECONDS
    target: Optional[str] = _j(default=None, omit=True)  # the matrix target it ran on
    server_url: Optional[str] = None  # the server that measured it, without credentials
    worker: Optional[str] = None  # the xdist worker that measured it
    run: Optional[Setup] = _j(default=None, omit=True)  # the setup as the measuring process saw it
    test: Optional[str] = _j(default=None, omit=True)  # the node id of the test that called cachecheck.check()
    #: why this divergence does not fail the run by itself (baseline, gate, recording); None when it does.
    #: Set once, by ``run.expectation``, where the record is made; every output reads it from here.
    expected: Optional[str] = _j(default=None, omit=True)
    #: the outcome checks (``expect``, a judge), when it had any
    check_results: Optional[CheckResults] = _j(default=None, omit=True)

    def __repr__(self) -> str:
        # short, and without the answers (a traceback with -l shows it; answers may echo what was sent)
        return f"ProbeRecord(id={self.id!r}, outcome={self.outcome.value!r}, reason={self.reason[:200]!r})"

    @property
    def different(self) -> bool:
        return self.outcome == Outcome.DIFFERENT

    def content(self, step: str) -> Optional[str]:
        for r in self.requests:
            if r.step == step:
                return r.content
        return None

    @property
    def cache_answer(self) -> Optional[str]:
        return self.content("cache-1/turn-2")

    @property
    def recompute_answer(self) -> Optional[str]:
        return self.content("recompute-1/turn-2")

    @property
    @_derived(after="checks")
    def answers(self) -> Dict[str, List[Optional[str]]]:
        return {name: [self.content(s) for s in steps] for name, steps in ANSWER_STEPS.items()}


# -- one episode ----------------------------------------------------------------------------------------
@dataclass
class ToolCall(_Json):
    name: str
    arguments: str = _j(missing="")  # the JSON text the server gave


@dataclass
class EpisodeStep(_Json):
    """One request of an episode's path: the answer (text and tool calls) and the server's counts."""

    step: int
    content: str = _j(missing="")
    tool_calls: List[ToolCall]
    finish_reason: Optional[str]
    prompt_tokens: Optional[int]
    completion_tokens: Optional[int]
    cached_tokens: Optional[int]

    def answer(self) -> Tuple[str, Tuple[Tuple[str, str], ...]]:
        """What a trajectory compares: the text and the calls (name, arguments)."""
        return self.content, tuple((c.name, c.arguments) for c in self.tool_calls)


@dataclass
class Path(_Json):
    """One run of one path of an episode: its steps and why it ended."""

    name: str = _j(key="path")  # cache-1, cache-2, recompute-1, recompute-2
    ended: str = ""  # "user turns ran out" | "max_steps reached" | "" (cut short by an error)
    steps: List[EpisodeStep] = field(default_factory=list)

    def trajectory(self) -> List[Tuple[str, Tuple[Tuple[str, str], ...]]]:
        return [s.answer() for s in self.steps]


@dataclass
class Parting(_Json):
    """Where the cache and recompute trajectories part: the step, what parted there, and how the text
    (of the answer or of the arguments) parted, with the logprob margins where the server gave them."""

    step: int
    what: str = _j(missing="text")  # "text" | "arguments" | "tool name" | "tool call or text"
    divergence: Optional[Divergence]
    cache_steps: int = _j(missing=0)
    recompute_steps: int = _j(missing=0)


@dataclass
class EpisodeRecord(_Measured):
    """One episode's measurement: outcome, why, where the trajectories parted, every path's steps."""

    id: str
    source: str = _j(missing="")
    fingerprint: str = _j(missing="")
    outcome: Outcome
    reason: str = ""
    parting: Optional[Parting] = None
    hit_tolerance: Optional[int] = None
    paths: List[Path] = field(default_factory=list)
    duration_s: float = _SECONDS
    target: Optional[str] = _j(default=None, omit=True)
    server_url: Optional[str] = None
    worker: Optional[str] = None
    run: Optional[Setup] = _j(default=None, omit=True)
    test: Optional[str] = _j(default=None, omit=True)
    expected: Optional[str] = _j(default=None, omit=True)  # as ProbeRecord.expected
    check_results: Optional[CheckResults] = _j(default=None, omit=True)  # as ProbeRecord.check_results

    def __repr__(self) -> str:
        return f"EpisodeRecord(id={self.id!r}, outcome={self.outcome.value!r}, reason={self.reason[:200]!r})"

    @property
    def changed(self) -> bool:
        return self.outcome == Outcome.DIFFERENT

    @property
    def requests(self) -> List[EpisodeStep]:
        return [s for p in self.paths for s in p.steps]

    def path(self, name: str) -> Optional[Path]:
        return next((p for p in self.paths if p.name == name), None)


class _Conditioned:
    """What a record measured under conditions (batch, loaded, order) shares: every line about it names them
    (``label``)."""

    id: str
    outcome: "Outcome"
    reason: str

    def label(self) -> str:
        raise NotImplementedError

    @property
    def different(self) -> bool:
        return self.outcome == Outcome.DIFFERENT

    def line(self) -> str:
        """``<id> [<conditions>] <outcome>``: one line naming the conditions it ran under."""
        return f"{self.id} [{self.label()}] {self.outcome.value}"

    def message(self) -> str:
        """The reason, naming the conditions: what a user sees for this outcome."""
        return f"[{self.label()}] {self.reason}" if self.reason else ""


# -- one batch probe (the measurement is batch.py's) -------------------------------------------------------
_WORDS = ("river lantern copper meadow harbor violin glacier orchard compass ember falcon granite hollow "
          "island juniper kettle ledger marble nectar oyster pepper quarry saddle thistle velvet walnut "
          "yarrow zephyr anchor basket candle dagger feather garnet helmet indigo jasmine kernel lichen "
          "mortar").split()


@dataclass(frozen=True)
class BatchShape(_Json):
    """The background traffic: ``concurrent`` requests in flight with each measured one, each a prompt of
    ``prompt_words`` words answered up to ``max_tokens`` tokens, generated from ``seed``; the measured request
    is sent ``lead_s`` seconds after them."""

    concurrent: int = 3
    prompt_words: int = 200
    max_tokens: int = 256
    seed: int = 0
    lead_s: float = 0.2

    def __post_init__(self) -> None:
        for name in ("concurrent", "prompt_words", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"the batch shape's {name} must be at least 1, not {getattr(self, name)}")
        if not 0 <= self.lead_s <= 60:
            raise ValueError(f"the batch shape's lead_s must be 0 to 60 seconds, not {self.lead_s}")

    @classmethod
    def of(cls, settings: Any) -> Optional["BatchShape"]:
        """The shape a run's settings ask for (--cachecheck-batch and its shape options); None when off."""
        if settings.batch is None:
            return None
        return cls(concurrent=settings.batch, prompt_words=settings.batch_prompt_words,
                   max_tokens=settings.batch_max_tokens, seed=settings.batch_seed, lead_s=settings.batch_lead)

    def traffic(self) -> str:
        """``3 background requests of 200 words, up to 256 tokens, seed 0``."""
        return (f"{self.concurrent} background request{'s' * (self.concurrent != 1)} of "
                f"{self.prompt_words} words, up to {self.max_tokens} tokens, seed {self.seed}"
                + (f", sent {self.lead_s:g} s ahead" if self.lead_s != BatchShape.lead_s else ""))

    def label(self) -> str:
        """The conditions, as every line about a batch measurement names them."""
        return f"batch: {self.traffic()}; cache off"

    def load_label(self) -> str:
        """The conditions, as every line about the cache under load names them (the cache path's own
        cache fields, the background's off)."""
        return f"cache under load: {self.traffic()}"

    def messages(self) -> List[List[Dict[str, str]]]:
        """The background requests' chat messages, the same for every probe and run of one shape."""
        out = []
        for i in range(self.concurrent):
            rng = random.Random(f"cachecheck-batch:{self.seed}:{i}")
            words = " ".join(rng.choice(_WORDS) for _ in range(self.prompt_words))
            out.append([{"role": "user", "content": f"Background task {i + 1}: write a long story that uses "
                                                    f"these words in order: {words}"}])
        return out


@dataclass
class LoadRun(_Json):
    """One load run as the client saw it: its background requests, how many of them were in flight when the
    measured request was sent and how many still when it was answered, and the seconds each side took."""

    run: int
    background: int
    in_flight_at_send: int = 0
    in_flight_at_answer: int = 0
    measured_s: float = _j(default=0.0, write=lambda s: round(s, 3))  # the measured request, sent to answered
    #: the first background request sent to the last answered
    background_s: float = _j(default=0.0, write=lambda s: round(s, 3))


@dataclass
class BatchRecord(_Conditioned, _Measured):
    """One probe's batch measurement. ``divergence`` reuses the cache measurement's type: its cache side is
    the answer alone, its recompute side the answer under load (of ``parted_run``)."""

    id: str
    source: str = _j(missing="")
    fingerprint: str = _j(missing="")
    outcome: Outcome
    shape: BatchShape = _j(key="conditions", default_factory=BatchShape)
    reason: str = ""
    divergence: Optional[Divergence] = None
    parted_run: Optional[int] = None  # the load run whose answer the divergence reads
    requests: List[Request] = field(default_factory=list)  # the measured ones, named by batch.STEPS
    loads: List[LoadRun] = field(default_factory=list)
    alone_s: List[float] = _j(default_factory=list, write=lambda v: [round(s, 3) for s in v])
    duration_s: float = _SECONDS
    target: Optional[str] = _j(default=None, omit=True)
    server_url: Optional[str] = None
    worker: Optional[str] = None
    run: Optional[Setup] = _j(default=None, omit=True)
    expected: Optional[str] = _j(default=None, omit=True)  # as ProbeRecord.expected

    def __repr__(self) -> str:
        return f"BatchRecord(id={self.id!r}, outcome={self.outcome.value!r}, reason={self.reason[:200]!r})"

    @property
    @_derived(after="id")
    def kind(self) -> str:
        return "batch"

    def label(self) -> str:
        return self.shape.label()


# -- one order probe (the measurement is order.py's) -------------------------------------------------------
@dataclass(frozen=True)
class OrderConditions(_Json):
    """How the order kind sent the probe set: ``between`` other conversations (generated like the batch
    kind's background, from ``seed``, ``prompt_words`` words answered up to ``max_tokens`` tokens) before each
    probe of the reversed pass B; no cache control fields; ``cache_ram``: the ``--cache-ram`` (MiB) of the
    llama-server the plugin started (None when it did not start the server)."""

    between: int = 1
    prompt_words: int = 60
    max_tokens: int = 32
    seed: int = 0
    cache_ram: Optional[int] = None

    @classmethod
    def of(cls, settings: Any) -> Optional["OrderConditions"]:
        """The conditions a run's settings ask for (--cachecheck-order); None when off."""
        if not getattr(settings, "order", False):
            return None
        return cls(between=settings.order_between,
                   cache_ram=settings.serve_cache_ram if settings.serve is not None else None)

    def label(self) -> str:
        """The conditions, as every line about the order kind names them."""
        served = f"; served llama-server --cache-ram {self.cache_ram}" if self.cache_ram is not None else ""
        return (f"order: server defaults, no cache fields; reversed, {self.between} other "
                f"conversation{'s' * (self.between != 1)} between{served}")

    def others(self) -> List[List[Dict[str, str]]]:
        """The other conversations' messages (sharing no text with any probe), the same in every run."""
        return BatchShape(concurrent=self.between, prompt_words=self.prompt_words, max_tokens=self.max_tokens,
                          seed=self.seed).messages()


@dataclass
class OrderRecord(_Conditioned, _Measured):
    """One probe's conversation sent twice as an application would: pass A in file order, pass B reversed
    with other conversations between. ``divergence`` reuses the cache measurement's type: its cache side is
    pass A's answer, its recompute side pass B's (of ``parted_turn``)."""

    id: str
    source: str = _j(missing="")
    fingerprint: str = _j(missing="")
    outcome: Outcome
    conditions: OrderConditions = _j(default_factory=OrderConditions)
    reason: str = ""
    divergence: Optional[Divergence] = None
    parted_turn: Optional[int] = None  # 1 or 2: the turn whose answers the divergence reads
    positions: List[int] = _j(default_factory=list)  # this probe's place (1-based) in pass A and in pass B
    requests: List[Request] = field(default_factory=list)  # named A/turn-1, A/turn-2, B/turn-1, B/turn-2
    duration_s: float = _SECONDS
    target: Optional[str] = _j(default=None, omit=True)
    server_url: Optional[str] = None
    worker: Optional[str] = None
    run: Optional[Setup] = _j(default=None, omit=True)
    expected: Optional[str] = _j(default=None, omit=True)  # as ProbeRecord.expected

    def __repr__(self) -> str:
        return f"OrderRecord(id={self.id!r}, outcome={self.outcome.value!r}, reason={self.reason[:200]!r})"

    @property
    @_derived(after="id")
    def kind(self) -> str:
        return "order"

    def label(self) -> str:
        return self.conditions.label()


#: what the batch kind said of the same probe (``LoadedRecord.load_alone``): its answer amid the same load,
#: the cache off, was the same as alone, different, or it was not measured in this process (off, deselected,
#: not yet run, or not valid)
LOAD_ALONE = ("same", "different", "not measured")


@dataclass
class LoadedRecord(_Conditioned, ProbeRecord):
    """One probe's cache measurement under load (the loaded kind): the probe protocol's record with every
    turn-2 request sent amid the background (``shape``), its load runs in the order sent (cache run 1,
    recompute run 1, cache run 2, recompute run 2: ``LOADED_STEPS``), and what the batch kind said of the same
    probe (``load_alone``: whether the load alone, the cache off, changed its answer)."""

    shape: BatchShape = _j(key="conditions", default_factory=BatchShape)
    loads: List[LoadRun] = field(default_factory=list)
    load_alone: str = "not measured"

    def __repr__(self) -> str:
        return f"LoadedRecord(id={self.id!r}, outcome={self.outcome.value!r}, reason={self.reason[:200]!r})"

    @property
    @_derived(after="id")
    def kind(self) -> str:
        return "loaded"

    def label(self) -> str:
        return self.shape.load_label()

    def message(self) -> str:
        """The reason, naming the conditions, and for a divergence what the load alone did."""
        alone = (f"\n  the load alone (batch kind, cache off): {self.load_alone}"
                 if self.outcome == Outcome.DIFFERENT else "")
        return super().message() + alone if self.reason else ""


#: the turn-2 requests a loaded record sends under load, in order (one LoadRun each)
LOADED_STEPS = ("cache-1/turn-2", "recompute-1/turn-2", "cache-2/turn-2", "recompute-2/turn-2")


# -- counts, rates and verdicts ---------------------------------------------------------------------------
@dataclass
class Tally(_Json):
    probes: int = 0
    same: int = 0
    different: int = 0
    inconclusive: int = 0
    errors: int = 0

    @property
    @_derived(after="probes")
    def valid(self) -> int:
        return self.same + self.different

    @classmethod
    def of(cls, records: Sequence[Union[ProbeRecord, "EpisodeRecord"]]) -> "Tally":
        t = cls(probes=len(records))
        for r in records:
            if r.outcome == Outcome.SAME:
                t.same += 1
            elif r.outcome == Outcome.DIFFERENT:
                t.different += 1
            elif r.outcome == Outcome.INCONCLUSIVE:
                t.inconclusive += 1
            else:
                t.errors += 1
        return t

    def __add__(self, other: "Tally") -> "Tally":
        return Tally(probes=self.probes + other.probes, same=self.same + other.same,
                     different=self.different + other.different,
                     inconclusive=self.inconclusive + other.inconclusive, errors=self.errors + other.errors)

    @property
    def rate(self) -> Optional["Rate"]:
        return Rate(different=self.different, valid=self.valid) if self.valid else None


@dataclass
class CheckTally(_Json):
    """The outcome checks of valid items (probes or episodes) with checks: each path's passes (its
    accuracy: passes / items), the flips each way and the exact McNemar test on them."""

    items: int = 0  # valid items with checks
    cache_passed: int = 0
    recompute_passed: int = 0
    cache_fails: int = 0  # flips: recompute passed, cache failed
    cache_passes: int = 0  # flips: cache passed, recompute failed
    check_errors: int = 0  # items whose check could not be evaluated (a judge raised)
    flipped: List[str] = field(default_factory=list)  # record keys of the flipped items

    @classmethod
    def of(cls, records: Sequence[Union["ProbeRecord", "EpisodeRecord"]]) -> Optional["CheckTally"]:
        """None when no record had checks."""
        checked = [r for r in records if r.check_results is not None]
        if not checked:
            return None
        t = cls()
        for r in checked:
            res = r.check_results
            assert res is not None
            if not r.valid or res.cache is None or res.recompute is None:
                continue
            if res.error is not None:
                t.check_errors += 1
                continue
            t.items += 1
            t.cache_passed += bool(res.cache.passed)
            t.recompute_passed += bool(res.recompute.passed)
            if res.flip == CACHE_FAILS:
                t.cache_fails += 1
            elif res.flip == CACHE_PASSES:
                t.cache_passes += 1
            if res.flip:
                t.flipped.append(r.key)
        return t

    def accuracy(self, path: str) -> Optional[float]:
        passed = self.cache_passed if path == "cache" else self.recompute_passed
        return passed / self.items if self.items else None

    @property
    @_derived(after="recompute_passed")
    def cache_accuracy(self) -> Optional[float]:
        return self.accuracy("cache")

    @property
    @_derived(after="recompute_passed")
    def recompute_accuracy(self) -> Optional[float]:
        return self.accuracy("recompute")

    @property
    @_derived(after="recompute_passed")
    def flips(self) -> int:
        return self.cache_fails + self.cache_passes

    @property
    @_derived(after="cache_passes")
    def mcnemar_p(self) -> float:
        return mcnemar_exact(self.cache_fails, self.cache_passes)


@dataclass(frozen=True)
class Rate(_Json):
    """A divergence rate: ``different`` of ``valid`` valid probes, with its 95% Wilson interval."""

    different: int
    valid: int

    @property
    @_derived(key="rate")
    def value(self) -> float:
        return self.different / self.valid

    @property
    @_derived()
    def ci95(self) -> Tuple[float, float]:
        ci = wilson(self.different, self.valid)
        assert ci is not None
        return ci

    @classmethod
    def of(cls, records: Sequence[Union[ProbeRecord, "EpisodeRecord"]]) -> Optional["Rate"]:
        return Tally.of(records).rate

    def text(self) -> str:
        """e.g. ``10.0% (2/20, 95% CI 2.8% to 30.1%)``."""
        lo, hi = self.ci95
        return f"{self.value:.1%} ({self.different}/{self.valid}, 95% CI {lo:.1%} to {hi:.1%})"

    @classmethod
    def _read(cls, f: _Field, keys: Mapping[str, str] = {}) -> Any:
        rate = super()._read(f, keys)
        return rate if rate.valid > 0 else None  # no valid probe: no rate


@dataclass
class Verdict:
    status: Status
    ok: bool
    why: str


class _Rated:
    """The ``rate`` and ``rate_ci95`` a summary writes after its counts (``tally``)."""

    rate: Optional[Rate]

    @property
    @_derived(after="tally", key="rate")
    def rate_value(self) -> Optional[float]:
        return self.rate.value if self.rate else None

    @property
    @_derived(after="tally")
    def rate_ci95(self) -> Optional[Tuple[float, float]]:
        return self.rate.ci95 if self.rate else None


@dataclass
class Summary(_Rated, _Json):
    """A run's or a target's counts, rate and verdict, as the report writes them."""

    tally: Tally = _j(flat={})
    status: Status
    why: str = ""
    exit_status: Optional[int] = None
    not_run: List[str] = field(default_factory=list)
    recompute_reuse_cause: Optional[str] = None
    #: a matrix's total: its rate is per target only (written as a null rate)
    per_target: bool = _j(default=False, write=False,
                          read=lambda f: f["rate"].value is None and Tally._read(f).valid > 0)

    @property  # type: ignore[override]
    def rate(self) -> Optional[Rate]:
        return None if self.per_target else self.tally.rate


@dataclass
class EpisodeSummary(_Rated, _Json):
    """The episodes' counts, the rate of changed trajectories and where they parted."""

    tally: Tally = _j(flat={"probes": "episodes", "different": "changed"})
    #: step -> changed episodes that parted there
    parting_steps: Dict[int, int] = _j(
        default_factory=dict, write=lambda s: {str(k): v for k, v in s.items()},
        read=lambda f: {int(k): v for k, v in f["parting_steps"].mapping().items()
                        if k.isdigit() and type(v) is int})
    not_run: List[str] = field(default_factory=list)

    @property  # type: ignore[override]
    def rate(self) -> Optional[Rate]:
        return self.tally.rate

    @classmethod
    def of(cls, records: Sequence["EpisodeRecord"], not_run: Sequence[str] = ()) -> "EpisodeSummary":
        steps: Dict[int, int] = {}
        for r in records:
            if r.parting is not None and r.outcome == Outcome.DIFFERENT:
                steps[r.parting.step] = steps.get(r.parting.step, 0) + 1
        return cls(tally=Tally.of(records), parting_steps=dict(sorted(steps.items())), not_run=list(not_run))


class _ConditionedSummary(_Rated):
    """What the summaries of the kinds measured under conditions share: the rate of their counts, and the
    conditions' label."""

    tally: Tally
    conditions: Any

    @property  # type: ignore[override]
    def rate(self) -> Optional[Rate]:
        return self.tally.rate

    def label(self) -> str:
        """The conditions, as every line about this kind names them."""
        return str(self.conditions.label())


@dataclass
class BatchSummary(_ConditionedSummary, _Json):
    """The batch probes' counts, the rate of answers changed amid other requests, and the conditions."""

    tally: Tally = _j(flat={})
    conditions: BatchShape = _j(default_factory=BatchShape)
    not_run: List[str] = field(default_factory=list)

    @classmethod
    def of(cls, records: Sequence["BatchRecord"], shape: BatchShape, not_run: Sequence[str] = ()
           ) -> "BatchSummary":
        return cls(tally=Tally.of(records), conditions=shape, not_run=list(not_run))  # type: ignore[arg-type]


@dataclass
class OrderSummary(_ConditionedSummary, _Json):
    """The order probes' counts, the rate of answers changed by order and state, and the conditions."""

    tally: Tally = _j(flat={})
    conditions: OrderConditions = _j(default_factory=OrderConditions)
    not_run: List[str] = field(default_factory=list)

    @classmethod
    def of(cls, records: Sequence["OrderRecord"], conditions: OrderConditions, not_run: Sequence[str] = ()
           ) -> "OrderSummary":
        tally = Tally.of(records)  # type: ignore[arg-type]
        return cls(tally=tally, conditions=conditions, not_run=list(not_run))


@dataclass
class LoadedSummary(_ConditionedSummary, _Json):
    """The cache probes under load: counts, the divergence rate under load, the conditions, and of the valid
    ones that diverged, how many the load alone (the batch kind on the same probe, cache off) changed too
    (``load_alone_different``) and how many it left the same (``load_alone_same``; the rest were not
    measured by the batch kind)."""

    tally: Tally = _j(flat={})
    conditions: BatchShape = _j(default_factory=BatchShape)
    load_alone_different: int = 0
    load_alone_same: int = 0
    not_run: List[str] = field(default_factory=list)

    def label(self) -> str:
        return self.conditions.load_label()

    @classmethod
    def of(cls, records: Sequence["LoadedRecord"], shape: BatchShape, not_run: Sequence[str] = ()
           ) -> "LoadedSummary":
        diverged = [r for r in records if r.outcome == Outcome.DIFFERENT]
        return cls(tally=Tally.of(records), conditions=shape, not_run=list(not_run),
                   load_alone_different=sum(1 for r in diverged if r.load_alone == "different"),
                   load_alone_same=sum(1 for r in diverged if r.load_alone == "same"))

    def attribution(self) -> str:
        """``2 of 18 valid loaded probes diverged under load; the load alone (batch, cache off) changed 1 of
        those 2``."""
        t = self.tally
        text = f"{t.different} of {t.valid} valid loaded probe{'s' * (t.valid != 1)} diverged under load"
        if not t.different:
            return text
        measured = self.load_alone_different + self.load_alone_same
        if t.different == 1:
            did = ("changed it too" if self.load_alone_different else "left it the same" if measured
                   else "was not measured (batch kind)")
            return f"{text}; the load alone (batch, cache off) {did}"
        text += f"; the load alone (batch, cache off) changed {self.load_alone_different} of those {t.different}"
        if measured < t.different:
            text += f" ({t.different - measured} not measured by the batch kind)"
        return text


# -- comparisons (with a baseline, or of a matrix target with the first) ----------------------------------
STILL_SAME = "still same"
STILL_DIFFERENT = "still different"
NEWLY_DIVERGED = "newly diverged"
HEALED = "healed"
NEWLY_INCONCLUSIVE = "newly inconclusive"
STILL_INCONCLUSIVE = "still inconclusive"
NEWLY_VALID = "newly valid"
CONVERSATION_CHANGED = "conversation changed"
NEW_PROBE = "new probe"
NOT_RUN = "not run"
#: every row status, most important first (the order rows are listed in)
STATUSES: Tuple[str, ...] = (NEWLY_DIVERGED, STILL_DIFFERENT, NEWLY_INCONCLUSIVE, HEALED, CONVERSATION_CHANGED,
                             NOT_RUN, NEW_PROBE, NEWLY_VALID, STILL_INCONCLUSIVE, STILL_SAME)
VERDICTS: Tuple[str, ...] = ("regressed", "improved", "unchanged", "inconclusive")



@dataclass
class Row(_Json):
    """One probe of a comparison: outcomes before (baseline) and after (this run), and the status."""

    id: str
    before: Optional[str]
    after: Optional[str]
    status: str


@dataclass
class Comparison(_Json):
    """Two runs compared probe by probe (see :mod:`pytest_cachecheck.baseline`). Rows most important first."""

    verdict: str = _j(missing="inconclusive")
    why: str = _j(missing="")
    mcnemar_p: Optional[float] = _j()
    paired: int = _j(missing=0)
    valid_in_both: int = _j(missing=0)
    counts: Dict[str, int] = _j()
    baseline_rate: Optional[Rate] = None
    current_rate: Optional[Rate] = None
    baseline_created: Optional[str] = None
    env_warnings: List[str] = field(default_factory=list)
    rows: List[Row] = field(default_factory=list)

    @property
    @_derived(after="valid_in_both", key="newly_diverged_count")
    def b(self) -> int:
        """Discordant pairs same -> different."""
        return self.counts.get(NEWLY_DIVERGED, 0)

    @property
    @_derived(after="valid_in_both", key="healed_count")
    def c(self) -> int:
        """Discordant pairs different -> same."""
        return self.counts.get(HEALED, 0)

    def newly_diverged(self) -> List[str]:
        return [r.id for r in self.rows if r.status == NEWLY_DIVERGED]

    def still_different(self) -> Set[str]:
        return {r.id for r in self.rows if r.status == STILL_DIFFERENT}

    @property
    @_derived(after="env_warnings", key="newly_diverged")
    def newly_diverged_ids(self) -> List[str]:
        return self.newly_diverged()

    @property
    @_derived(after="env_warnings", key="still_different")
    def still_different_ids(self) -> List[str]:
        return sorted(self.still_different())


# -- targets and the run ----------------------------------------------------------------------------------
@dataclass
class ProbeSet(_Json):
    name: str = _j(missing="?")
    count: int = _j(missing=0)
    fingerprint: str = _j(missing="")


@dataclass
class TargetReport(_Json):
    """What one server (one target of a matrix, or the only one) measured, and its own verdict: an entry
    of the report's ``targets``. Its probes and episodes are the report's, written once at the top."""

    name: Optional[str]  # None without a matrix
    url: Optional[str]  # without credentials
    setup: Setup = _j(flat={})
    served: Optional[Dict[str, Any]] = _j()  # --cachecheck-serve's server, as serve.Served.describe()
    summary: Summary = _j(missing=None)  # None only while reading a report without one
    probes: List[ProbeRecord] = _j(default_factory=list, write=False, read=False)
    baseline: Optional[Comparison] = _j(default=None, omit=True)
    vs_reference: Optional[Comparison] = _j(default=None, omit=True)  # a matrix target compared with the first
    #: the episodes (None when the run had none configured), their summary and comparisons
    episodes: Optional[List[EpisodeRecord]] = _j(default=None, write=False, read=False)
    episode_summary: Optional[EpisodeSummary] = _j(default=None, omit=True)
    episode_baseline: Optional[Comparison] = _j(default=None, omit=True)
    episode_vs_reference: Optional[Comparison] = _j(default=None, omit=True)
    #: the batch probes (None when the batch kind was off) and their summary
    batches: Optional[List[BatchRecord]] = _j(default=None, write=False, read=False)
    batch_summary: Optional[BatchSummary] = _j(default=None, omit=True)
    #: the cache probes under load (None when the loaded kind was off) and their summary
    loaded: Optional[List[LoadedRecord]] = _j(default=None, write=False, read=False)
    loaded_summary: Optional[LoadedSummary] = _j(default=None, omit=True)
    #: the order probes (None when the order kind was off) and their summary
    orders: Optional[List[OrderRecord]] = _j(default=None, write=False, read=False)
    order_summary: Optional[OrderSummary] = _j(default=None, omit=True)

    def check_tallies(self) -> Tuple[Optional[CheckTally], Optional[CheckTally]]:
        """The outcome checks of the probes and of the episodes (None where none had checks)."""
        return self.check_summary, self.episode_check_summary

    @property
    @_derived(omit=True)
    def check_summary(self) -> Optional[CheckTally]:
        return CheckTally.of(self.probes)

    @property
    @_derived(omit=True)
    def episode_check_summary(self) -> Optional[CheckTally]:
        return CheckTally.of(self.episodes or [])


#: the keys of a schema_version 1 report that are the run's; without a matrix the others were its target's
_RUN_KEYS_V1 = ("schema_version", "tool", "created", "settings", "probe_set", "episode_set", "summary", "probes",
                "episodes", "checks", "episode_checks")


@dataclass
class RunReport(_Json):
    """The whole run: settings, the probe set, one report per target, the verdict and the checks of
    ``cachecheck.check()``. Without a matrix there is one target, named None."""

    created: str = _j(missing="")
    settings: Dict[str, Any] = _j()  # Settings.public(): URLs without credentials, never the key
    probe_set: ProbeSet = _j(missing=None)  # None only while reading a report without one
    summary: Summary = _j(missing=None)  # the run's verdict; without a matrix, its target's summary
    targets: List[TargetReport] = _j()
    tool_version: str = _j(default=__version__, write=False, read=lambda f: str(
        f["tool"].value.get("version") or "") if isinstance(f["tool"].value, dict) else "")
    checks: List[ProbeRecord] = _j(default_factory=list, omit=True)
    episode_set: Optional[ProbeSet] = _j(default=None, omit=True)  # None: no episodes configured
    episode_checks: List[EpisodeRecord] = _j(default_factory=list, omit=True)  # of cachecheck.episode()

    @property
    def matrix(self) -> bool:
        return any(t.name is not None for t in self.targets)

    @property
    @_derived(after="targets")
    def probes(self) -> List[ProbeRecord]:
        return [p for t in self.targets for p in t.probes]

    @property
    def episodes(self) -> List[EpisodeRecord]:
        return [e for t in self.targets for e in t.episodes or []]

    @property
    @_derived(after="targets", key="episodes", omit=True)
    def episode_records(self) -> Optional[List[EpisodeRecord]]:
        return self.episodes if self.episode_set is not None else None

    def _every(self, attr: str) -> Optional[List[Any]]:
        """Every target's records of a kind measured under conditions (their ``attr``), in target order; None
        when the kind was off (no target has the list)."""
        lists = [getattr(t, attr) for t in self.targets]
        if all(x is None for x in lists):
            return None
        return [r for x in lists for r in x or []]

    @property
    @_derived(after="targets", key="batches", omit=True)
    def batch_records(self) -> Optional[List[BatchRecord]]:
        """Every target's batch probes; None when the batch kind was off."""
        return self._every("batches")

    @property
    @_derived(after="targets", key="loaded", omit=True)
    def loaded_records(self) -> Optional[List[LoadedRecord]]:
        """Every target's cache probes under load; None when the loaded kind was off."""
        return self._every("loaded")

    @property
    @_derived(after="targets", key="orders", omit=True)
    def order_records(self) -> Optional[List[OrderRecord]]:
        """Every target's order probes; None when the order kind was off."""
        return self._every("orders")

    @property
    @_derived(after="episode_checks", omit=True)
    def own_check_summary(self) -> Optional[CheckTally]:
        """The outcome checks of the tests' own measurements (``checks``, ``episode_checks``); None when none
        had checks."""
        return CheckTally.of([*self.checks, *self.episode_checks])

    def target(self, name: Optional[str]) -> TargetReport:
        for t in self.targets:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_json(self) -> Dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "tool": {"name": TOOL, "version": self.tool_version},
                **super().to_json()}

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> "RunReport":
        """Read a report written by ``--cachecheck-report`` (schema_version 2, or 1: the one before, flat
        without a matrix); raises ReportError naming what is wrong."""
        hint = "pass a file written by --cachecheck-report"
        if not isinstance(data, dict):
            raise ReportError(f"not a pytest-cachecheck report (the JSON is a {type(data).__name__}, not an "
                              f"object); {hint}")
        tool = data.get("tool")
        if isinstance(tool, dict) and tool.get("name") not in (None, TOOL):
            raise ReportError(f"not a pytest-cachecheck report (written by {str(tool.get('name'))[:80]!r}); {hint}")
        if "schema_version" not in data:
            raise ReportError(f"not a pytest-cachecheck report (no schema_version); {hint}")
        version = data["schema_version"]
        if version not in READ_VERSIONS or isinstance(version, bool) or not isinstance(version, int):
            raise ReportError(f"unsupported schema_version {repr(version)[:40]}; this version of pytest-cachecheck "
                              f"reads schema_version {' and '.join(map(str, READ_VERSIONS))}")
        if not isinstance(data.get("probes"), list):
            raise ReportError(f"not a pytest-cachecheck report (no 'probes' list); {hint}")
        f = _Field(data, "")
        flat = version == 1 and not (isinstance(data.get("targets"), list) and data["targets"])
        report = cls._read(_Field({k: v for k, v in data.items() if k != "targets"}, "") if flat else f)
        if flat:  # schema_version 1 without a matrix: the target's fields are the report's
            report.targets = [TargetReport._read(f)]
            report.targets[0].url = report.settings.get("url") if isinstance(report.settings.get("url"), str) else None
        elif not report.targets:
            raise f["targets"].fail("a list of at least one target")
        elif len(report.targets) > 1:
            for t in f["targets"].items():
                t["name"].string()  # several targets: each has a name
        probes = _typed(List[ProbeRecord], f["probes"])
        episodes = _typed(List[EpisodeRecord], f["episodes"]) if f["episodes"].value is not None else []
        batches = _typed(List[BatchRecord], f["batches"]) if f["batches"].value is not None else None
        loaded = _typed(List[LoadedRecord], f["loaded"]) if f["loaded"].value is not None else None
        orders = _typed(List[OrderRecord], f["orders"]) if f["orders"].value is not None else None
        names = {t.name for t in report.targets}
        for kind, records in (("probes", probes), ("episodes", episodes), ("batches", batches or []),
                              ("loaded", loaded or []), ("orders", orders or [])):
            for i, r in enumerate(records):
                if r.target not in names:
                    raise ReportError(f"field '{kind}[{i}].target': {str(r.target)[:60]!r} names none of "
                                      f"the report's targets")
        for t in report.targets:
            t.probes = [p for p in probes if p.target == t.name]
            t.episodes = [e for e in episodes if e.target == t.name] if report.episode_set is not None else None
            t.batches = [b for b in batches if b.target == t.name] if batches is not None else None
            t.orders = [o for o in orders if o.target == t.name] if orders is not None else None
            t.loaded = [x for x in loaded if x.target == t.name] if loaded is not None else None
            t.summary = t.summary or Summary(tally=Tally.of(t.probes), status=Status.PASSED, why="")
        report.summary = report.summary or report.targets[0].summary
        report.probe_set = report.probe_set or ProbeSet(name="?", count=len(probes), fingerprint="")
        return report
