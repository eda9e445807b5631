"""The result model: what one probe measured, what one target and the whole run came to, as typed
dataclasses with one ``to_json`` / ``from_json`` pair each.

Every writer (terminal, JSON report, HTML page, baseline comparison) reads these objects; the JSON form
is ``SCHEMA_VERSION`` 1. ``RunReport.from_json`` also reads a baseline file, and its errors name the field
that is wrong. Nothing here knows pytest or HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union

from . import __version__
from .stats import mcnemar_exact, wilson
from .text import printable

SCHEMA_VERSION = 1
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


# -- reading JSON with errors that name the field -------------------------------------------------------
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

    def has(self, key: str) -> bool:
        return isinstance(self.value, dict) and key in self.value

    def items(self) -> List["_Field"]:
        if not isinstance(self.value, list):
            raise self.fail("a list")
        return [_Field(v, f"{self.path}[{i}]") for i, v in enumerate(self.value)]

    def opt_items(self) -> List["_Field"]:
        return [] if self.value is None else self.items()

    def string(self) -> str:
        if not isinstance(self.value, str):
            raise self.fail("a string")
        return self.value

    def opt_string(self) -> Optional[str]:
        return None if self.value is None else self.string()

    def integer(self) -> int:
        if isinstance(self.value, bool) or not isinstance(self.value, int):
            raise self.fail("a whole number")
        return self.value

    def opt_integer(self) -> Optional[int]:
        return None if self.value is None else self.integer()

    def opt_float(self) -> Optional[float]:
        if self.value is None:
            return None
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)):
            raise self.fail("a number")
        return float(self.value)

    def opt_bool(self) -> Optional[bool]:
        if self.value is None:
            return None
        if not isinstance(self.value, bool):
            raise self.fail("true or false")
        return self.value

    def mapping(self) -> Dict[str, Any]:
        if self.value is None:
            return {}
        if not isinstance(self.value, dict):
            raise self.fail("an object")
        return self.value

    def strings(self) -> List[str]:
        return [f.string() for f in self.opt_items()]


def _word(cls: Any, f: _Field) -> Any:
    text = f.string()
    try:
        return cls(text)
    except ValueError:
        raise ReportError(f"field '{f.path}': unknown value {text!r}; expected one of "
                          + ", ".join(m.value for m in cls)) from None


def _outcome(f: _Field) -> Outcome:
    return _word(Outcome, f)


# -- one probe ------------------------------------------------------------------------------------------
@dataclass
class ServerDescription:
    """What a server said about itself."""

    kind: str  # llama.cpp | vllm | sglang | openai
    build: Optional[str] = None
    model: Optional[str] = None
    details: Dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        """``kind build model`` for tables, each part as it may be shown (a server's strings are untrusted)."""
        return " ".join(shown(x) for x in (self.kind, self.build, self.model) if x) or "?"

    def to_json(self) -> Dict[str, Any]:
        return {"kind": self.kind, "build": self.build, "model": self.model, "details": self.details}

    @classmethod
    def from_json(cls, f: _Field) -> Optional["ServerDescription"]:
        if f.value is None:
            return None
        return cls(f["kind"].opt_string() or "?", f["build"].opt_string(), f["model"].opt_string(), f["details"].mapping())


@dataclass
class Setup:
    """The resolved server setup as the measuring process saw it: mode, servers, tolerance, checks."""

    mode: Optional[str]
    server: Optional[ServerDescription]
    nocache_server: Optional[ServerDescription] = None
    hit_tolerance: Optional[int] = None  # set when raised to the server's block size - 1
    setup_warnings: List[str] = field(default_factory=list)
    setup_checks: List[str] = field(default_factory=list)

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"mode": self.mode, "server": self.server.to_json() if self.server else None,
                               "hit_tolerance": self.hit_tolerance, "setup_warnings": list(self.setup_warnings),
                               "setup_checks": list(self.setup_checks)}
        if self.nocache_server is not None:
            out["nocache_server"] = self.nocache_server.to_json()
        return out

    @classmethod
    def from_json(cls, f: _Field) -> Optional["Setup"]:
        if f.value is None:
            return None
        return cls(f["mode"].opt_string(), ServerDescription.from_json(f["server"]),
                   ServerDescription.from_json(f["nocache_server"]), f["hit_tolerance"].opt_integer(),
                   f["setup_warnings"].strings(), f["setup_checks"].strings())


@dataclass
class Request:
    """One request of a probe and what the server said (the report keeps no logprobs)."""

    step: str  # cache-1/turn-1, cache-1/turn-2, ..., recompute-2/turn-2
    server: str  # "cache" or "nocache"
    content: str
    finish_reason: Optional[str]
    prompt_tokens: Optional[int]
    completion_tokens: Optional[int]
    cached_tokens: Optional[int]
    reasoning_chars: int = 0

    def to_json(self) -> Dict[str, Any]:
        return {"step": self.step, "server": self.server, "content": self.content,
                "finish_reason": self.finish_reason, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "cached_tokens": self.cached_tokens,
                "reasoning_chars": self.reasoning_chars}

    @classmethod
    def from_json(cls, f: _Field) -> "Request":
        return cls(f["step"].string(), f["server"].opt_string() or "cache", f["content"].opt_string() or "",
                   f["finish_reason"].opt_string(), f["prompt_tokens"].opt_integer(), f["completion_tokens"].opt_integer(),
                   f["cached_tokens"].opt_integer(), f["reasoning_chars"].opt_integer() or 0)


@dataclass
class Divergence:
    """Where the cache and recompute answers part, and how sure each path was there."""

    char: int
    token: Optional[int]
    cache_excerpt: str
    recompute_excerpt: str
    cache_token: Optional[str] = None
    recompute_token: Optional[str] = None
    cache_margin: Optional[float] = None
    recompute_margin: Optional[float] = None

    @property
    def kind(self) -> Optional[str]:
        """``near-tie`` (the margins add up to at most NEAR_TIE_NATS), ``large-gap`` (at least one path was
        sure), or None without margins."""
        if self.cache_margin is None or self.recompute_margin is None:
            return None
        return "near-tie" if self.cache_margin + self.recompute_margin <= NEAR_TIE_NATS else "large-gap"

    def anatomy(self) -> Optional[str]:
        if self.cache_token is None or self.recompute_token is None:
            return None
        text = f"token {self.token}: cache {self.cache_token!r} vs recompute {self.recompute_token!r}"
        if self.kind is not None:
            assert self.cache_margin is not None and self.recompute_margin is not None
            text += (f"; top-2 logprob margin {self.cache_margin:.4f} (cache) and {self.recompute_margin:.4f} "
                     f"(recompute) nats: {self.kind}")
        return text

    def to_json(self) -> Dict[str, Any]:
        return {"char": self.char, "token": self.token, "cache_excerpt": self.cache_excerpt,
                "recompute_excerpt": self.recompute_excerpt, "cache_token": self.cache_token,
                "recompute_token": self.recompute_token, "cache_margin": self.cache_margin,
                "recompute_margin": self.recompute_margin, "kind": self.kind,
                "near_tie_threshold": NEAR_TIE_NATS}

    @classmethod
    def from_json(cls, f: _Field) -> Optional["Divergence"]:
        if f.value is None:
            return None
        return cls(f["char"].integer(), f["token"].opt_integer(), f["cache_excerpt"].opt_string() or "",
                   f["recompute_excerpt"].opt_string() or "", f["cache_token"].opt_string(),
                   f["recompute_token"].opt_string(), f["cache_margin"].opt_float(), f["recompute_margin"].opt_float())


@dataclass
class HitCheck:
    """One cache run's turn-2 hit against what it had to reach."""

    run: int
    cached_tokens: Optional[int]
    turn1_prompt_tokens: int
    turn1_answer_tokens: int
    expected_at_least: int
    full_reuse: int

    def to_json(self) -> Dict[str, Any]:
        return {"run": self.run, "cached_tokens": self.cached_tokens, "turn1_prompt_tokens": self.turn1_prompt_tokens,
                "turn1_answer_tokens": self.turn1_answer_tokens, "expected_at_least": self.expected_at_least,
                "full_reuse": self.full_reuse}

    @classmethod
    def from_json(cls, f: _Field) -> "HitCheck":
        return cls(f["run"].integer(), f["cached_tokens"].opt_integer(), f["turn1_prompt_tokens"].integer(),
                   f["turn1_answer_tokens"].integer(), f["expected_at_least"].integer(), f["full_reuse"].integer())


@dataclass
class Checks:
    """What the validity rules read: the tolerance, each cache run's hit, whether recompute reused."""

    hit_tolerance: int
    skip_hit_check: bool
    cache_hits: List[HitCheck] = field(default_factory=list)
    recompute_reused: bool = False

    def to_json(self) -> Dict[str, Any]:
        return {"hit_tolerance": self.hit_tolerance, "skip_hit_check": self.skip_hit_check,
                "cache_hits": [h.to_json() for h in self.cache_hits], "recompute_reused": self.recompute_reused}

    @classmethod
    def from_json(cls, f: _Field) -> Optional["Checks"]:
        if not f.value:
            return None
        return cls(f["hit_tolerance"].opt_integer() or 0, bool(f["skip_hit_check"].opt_bool()),
                   [HitCheck.from_json(h) for h in f["cache_hits"].opt_items()],
                   bool(f["recompute_reused"].opt_bool()))


CACHE_FAILS = "cache-fails"  # a flip: the recompute path passes its checks, the cache path fails them
CACHE_PASSES = "cache-passes"  # a flip the other way


@dataclass
class CheckResult:
    """One path's result on an item's outcome checks (``expect``, or a test's judge)."""

    passed: Optional[bool]  # None: the check itself failed (a test's judge raised), which is never a flip
    reason: str = ""  # when it did not pass: the first failing check and why

    def to_json(self) -> Dict[str, Any]:
        return {"passed": self.passed, "reason": self.reason}

    @classmethod
    def from_json(cls, f: _Field) -> Optional["CheckResult"]:
        if f.value is None:
            return None
        return cls(f["passed"].opt_bool(), f["reason"].opt_string() or "")


@dataclass
class CheckResults:
    """An item's outcome checks and their result on each path (none when the item was not valid)."""

    checks: List[str]  # each check as described
    cache: Optional[CheckResult] = None
    recompute: Optional[CheckResult] = None

    @property
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

    def to_json(self) -> Dict[str, Any]:
        return {"checks": list(self.checks), "cache": self.cache.to_json() if self.cache else None,
                "recompute": self.recompute.to_json() if self.recompute else None, "flip": self.flip}

    @classmethod
    def from_json(cls, f: _Field) -> Optional["CheckResults"]:
        if f.value is None:
            return None
        return cls(f["checks"].strings(), CheckResult.from_json(f["cache"]), CheckResult.from_json(f["recompute"]))


ANSWER_STEPS = {"turn1": ("cache-1/turn-1", "cache-2/turn-1"), "cache": ("cache-1/turn-2", "cache-2/turn-2"),
                "recompute": ("recompute-1/turn-2", "recompute-2/turn-2")}


class _Measured:
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
    source: str
    fingerprint: str
    outcome: Outcome
    reason: str = ""
    divergence: Optional[Divergence] = None
    checks: Optional[Checks] = None
    requests: List[Request] = field(default_factory=list)
    duration_s: float = 0.0
    target: Optional[str] = None  # the matrix target it ran on
    server_url: Optional[str] = None  # the server that measured it, without credentials
    worker: Optional[str] = None  # the xdist worker that measured it
    run: Optional[Setup] = None  # the setup as the measuring process saw it
    test: Optional[str] = None  # the node id of the test that called cachecheck.check()
    #: why this divergence does not fail the run by itself (baseline, gate, recording); None when it does.
    #: Set once, by ``run.expectation``, where the record is made; every output reads it from here.
    expected: Optional[str] = None
    check_results: Optional[CheckResults] = None  # the outcome checks (``expect``, a judge), when it had any

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

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {
            "id": self.id, "source": self.source, "fingerprint": self.fingerprint, "outcome": self.outcome.value,
            "reason": self.reason, "divergence": self.divergence.to_json() if self.divergence else None,
            "checks": self.checks.to_json() if self.checks else {},
            "answers": {name: [self.content(s) for s in steps] for name, steps in ANSWER_STEPS.items()},
            "requests": [r.to_json() for r in self.requests], "duration_s": round(self.duration_s, 3)}
        if self.target is not None:
            out["target"] = self.target
        out["server_url"] = self.server_url
        out["worker"] = self.worker
        if self.run is not None:
            out["run"] = self.run.to_json()
        if self.test is not None:
            out["test"] = self.test
        if self.expected is not None:
            out["expected"] = self.expected
        if self.check_results is not None:
            out["check_results"] = self.check_results.to_json()
        return out

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> "ProbeRecord":
        f = _Field(data, path)
        return cls(f["id"].string(), f["source"].opt_string() or "", f["fingerprint"].opt_string() or "",
                   _outcome(f["outcome"]), f["reason"].opt_string() or "", Divergence.from_json(f["divergence"]),
                   Checks.from_json(f["checks"]), [Request.from_json(r) for r in f["requests"].opt_items()],
                   f["duration_s"].opt_float() or 0.0, f["target"].opt_string(), f["server_url"].opt_string(),
                   f["worker"].opt_string(), Setup.from_json(f["run"]), f["test"].opt_string(),
                   f["expected"].opt_string(), CheckResults.from_json(f["check_results"]))


# -- one episode ----------------------------------------------------------------------------------------
@dataclass
class ToolCall:
    name: str
    arguments: str  # the JSON text the server gave

    def to_json(self) -> Dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}

    @classmethod
    def from_json(cls, f: _Field) -> "ToolCall":
        return cls(f["name"].string(), f["arguments"].opt_string() or "")


@dataclass
class EpisodeStep:
    """One request of an episode's path: the answer (text and tool calls) and the server's counts."""

    step: int
    content: str
    tool_calls: List[ToolCall]
    finish_reason: Optional[str]
    prompt_tokens: Optional[int]
    completion_tokens: Optional[int]
    cached_tokens: Optional[int]

    def answer(self) -> Tuple[str, Tuple[Tuple[str, str], ...]]:
        """What a trajectory compares: the text and the calls (name, arguments)."""
        return self.content, tuple((c.name, c.arguments) for c in self.tool_calls)

    def to_json(self) -> Dict[str, Any]:
        return {"step": self.step, "content": self.content, "tool_calls": [c.to_json() for c in self.tool_calls],
                "finish_reason": self.finish_reason, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "cached_tokens": self.cached_tokens}

    @classmethod
    def from_json(cls, f: _Field) -> "EpisodeStep":
        return cls(f["step"].integer(), f["content"].opt_string() or "",
                   [ToolCall.from_json(c) for c in f["tool_calls"].opt_items()], f["finish_reason"].opt_string(),
                   f["prompt_tokens"].opt_integer(), f["completion_tokens"].opt_integer(),
                   f["cached_tokens"].opt_integer())


@dataclass
class Path:
    """One run of one path of an episode: its steps and why it ended."""

    name: str  # cache-1, cache-2, recompute-1, recompute-2
    steps: List[EpisodeStep] = field(default_factory=list)
    ended: str = ""  # "user turns ran out" | "max_steps reached" | "" (cut short by an error)

    def trajectory(self) -> List[Tuple[str, Tuple[Tuple[str, str], ...]]]:
        return [s.answer() for s in self.steps]

    def to_json(self) -> Dict[str, Any]:
        return {"path": self.name, "ended": self.ended, "steps": [s.to_json() for s in self.steps]}

    @classmethod
    def from_json(cls, f: _Field) -> "Path":
        return cls(f["path"].string(), [EpisodeStep.from_json(s) for s in f["steps"].opt_items()],
                   f["ended"].opt_string() or "")


@dataclass
class Parting:
    """Where the cache and recompute trajectories part: the step, what parted there, and how the text
    (of the answer or of the arguments) parted, with the logprob margins where the server gave them."""

    step: int
    what: str  # "text" | "arguments" | "tool name" | "tool call or text"
    divergence: Optional[Divergence]
    cache_steps: int
    recompute_steps: int

    def to_json(self) -> Dict[str, Any]:
        return {"step": self.step, "what": self.what,
                "divergence": self.divergence.to_json() if self.divergence else None,
                "cache_steps": self.cache_steps, "recompute_steps": self.recompute_steps}

    @classmethod
    def from_json(cls, f: _Field) -> Optional["Parting"]:
        if f.value is None:
            return None
        return cls(f["step"].integer(), f["what"].opt_string() or "text", Divergence.from_json(f["divergence"]),
                   f["cache_steps"].opt_integer() or 0, f["recompute_steps"].opt_integer() or 0)


@dataclass
class EpisodeRecord(_Measured):
    """One episode's measurement: outcome, why, where the trajectories parted, every path's steps."""

    id: str
    source: str
    fingerprint: str
    outcome: Outcome
    reason: str = ""
    parting: Optional[Parting] = None
    paths: List[Path] = field(default_factory=list)
    hit_tolerance: Optional[int] = None
    duration_s: float = 0.0
    target: Optional[str] = None
    server_url: Optional[str] = None
    worker: Optional[str] = None
    run: Optional[Setup] = None
    test: Optional[str] = None
    expected: Optional[str] = None  # as ProbeRecord.expected
    check_results: Optional[CheckResults] = None  # as ProbeRecord.check_results

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

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {
            "id": self.id, "source": self.source, "fingerprint": self.fingerprint, "outcome": self.outcome.value,
            "reason": self.reason, "parting": self.parting.to_json() if self.parting else None,
            "hit_tolerance": self.hit_tolerance, "paths": [p.to_json() for p in self.paths],
            "duration_s": round(self.duration_s, 3)}
        if self.target is not None:
            out["target"] = self.target
        out["server_url"] = self.server_url
        out["worker"] = self.worker
        if self.run is not None:
            out["run"] = self.run.to_json()
        if self.test is not None:
            out["test"] = self.test
        if self.expected is not None:
            out["expected"] = self.expected
        if self.check_results is not None:
            out["check_results"] = self.check_results.to_json()
        return out

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> "EpisodeRecord":
        f = _Field(data, path)
        return cls(f["id"].string(), f["source"].opt_string() or "", f["fingerprint"].opt_string() or "",
                   _outcome(f["outcome"]), f["reason"].opt_string() or "", Parting.from_json(f["parting"]),
                   [Path.from_json(p) for p in f["paths"].opt_items()], f["hit_tolerance"].opt_integer(),
                   f["duration_s"].opt_float() or 0.0, f["target"].opt_string(), f["server_url"].opt_string(),
                   f["worker"].opt_string(), Setup.from_json(f["run"]), f["test"].opt_string(),
                   f["expected"].opt_string(), CheckResults.from_json(f["check_results"]))


# -- counts, rates and verdicts ---------------------------------------------------------------------------
@dataclass
class Tally:
    probes: int = 0
    same: int = 0
    different: int = 0
    inconclusive: int = 0
    errors: int = 0

    @property
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
        return Tally(self.probes + other.probes, self.same + other.same, self.different + other.different,
                     self.inconclusive + other.inconclusive, self.errors + other.errors)

    @property
    def rate(self) -> Optional["Rate"]:
        return Rate(self.different, self.valid) if self.valid else None


@dataclass
class CheckTally:
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

    @property
    def flips(self) -> int:
        return self.cache_fails + self.cache_passes

    def accuracy(self, path: str) -> Optional[float]:
        passed = self.cache_passed if path == "cache" else self.recompute_passed
        return passed / self.items if self.items else None

    @property
    def mcnemar_p(self) -> float:
        return mcnemar_exact(self.cache_fails, self.cache_passes)

    def to_json(self) -> Dict[str, Any]:
        return {"items": self.items, "cache_passed": self.cache_passed, "recompute_passed": self.recompute_passed,
                "cache_accuracy": self.accuracy("cache"), "recompute_accuracy": self.accuracy("recompute"),
                "flips": self.flips, "cache_fails": self.cache_fails, "cache_passes": self.cache_passes,
                "mcnemar_p": self.mcnemar_p, "check_errors": self.check_errors, "flipped": list(self.flipped)}


@dataclass(frozen=True)
class Rate:
    """A divergence rate: ``different`` of ``valid`` valid probes, with its 95% Wilson interval."""

    different: int
    valid: int

    @property
    def value(self) -> float:
        return self.different / self.valid

    @property
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

    def to_json(self) -> Dict[str, Any]:
        return {"different": self.different, "valid": self.valid, "rate": self.value, "ci95": list(self.ci95)}

    @classmethod
    def from_json(cls, f: _Field) -> Optional["Rate"]:
        if f.value is None:
            return None
        valid = f["valid"].integer()
        return cls(f["different"].integer(), valid) if valid > 0 else None


@dataclass
class Verdict:
    status: Status
    ok: bool
    why: str


@dataclass
class Summary:
    """A run's or a target's counts, rate and verdict, as the report writes them."""

    tally: Tally
    status: Status
    why: str
    exit_status: Optional[int] = None
    not_run: List[str] = field(default_factory=list)
    recompute_reuse_cause: Optional[str] = None
    per_target: bool = False  # a matrix's total: its rate is per target only

    @property
    def rate(self) -> Optional[Rate]:
        return None if self.per_target else self.tally.rate

    def to_json(self) -> Dict[str, Any]:
        t, rate = self.tally, self.rate
        return {"probes": t.probes, "valid": t.valid, "same": t.same, "different": t.different,
                "inconclusive": t.inconclusive, "errors": t.errors,
                "rate": rate.value if rate else None, "rate_ci95": list(rate.ci95) if rate else None,
                "status": self.status.value, "why": self.why, "exit_status": self.exit_status,
                "not_run": list(self.not_run), "recompute_reuse_cause": self.recompute_reuse_cause}

    @classmethod
    def from_json(cls, f: _Field) -> "Summary":
        tally = Tally(*(f[k].opt_integer() or 0 for k in ("probes", "same", "different", "inconclusive", "errors")))
        return cls(tally, _word(Status, f["status"]), f["why"].opt_string() or "", f["exit_status"].opt_integer(),
                   f["not_run"].strings(), f["recompute_reuse_cause"].opt_string(), f["rate"].value is None
                   and tally.valid > 0)


@dataclass
class EpisodeSummary:
    """The episodes' counts, the rate of changed trajectories and where they parted."""

    tally: Tally
    parting_steps: Dict[int, int] = field(default_factory=dict)  # step -> changed episodes that parted there
    not_run: List[str] = field(default_factory=list)

    @classmethod
    def of(cls, records: Sequence["EpisodeRecord"], not_run: Sequence[str] = ()) -> "EpisodeSummary":
        steps: Dict[int, int] = {}
        for r in records:
            if r.parting is not None and r.outcome == Outcome.DIFFERENT:
                steps[r.parting.step] = steps.get(r.parting.step, 0) + 1
        return cls(Tally.of(records), dict(sorted(steps.items())), list(not_run))

    def to_json(self) -> Dict[str, Any]:
        t, rate = self.tally, self.tally.rate
        return {"episodes": t.probes, "valid": t.valid, "same": t.same, "changed": t.different,
                "inconclusive": t.inconclusive, "errors": t.errors, "rate": rate.value if rate else None,
                "rate_ci95": list(rate.ci95) if rate else None,
                "parting_steps": {str(k): v for k, v in self.parting_steps.items()}, "not_run": list(self.not_run)}

    @classmethod
    def from_json(cls, f: _Field) -> Optional["EpisodeSummary"]:
        if f.value is None:
            return None
        tally = Tally(*(f[k].opt_integer() or 0 for k in ("episodes", "same", "changed", "inconclusive", "errors")))
        steps = {int(k): v for k, v in f["parting_steps"].mapping().items() if k.isdigit() and isinstance(v, int)}
        return cls(tally, steps, f["not_run"].strings())


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
class Row:
    """One probe of a comparison: outcomes before (baseline) and after (this run), and the status."""

    id: str
    before: Optional[str]
    after: Optional[str]
    status: str

    def to_json(self) -> Dict[str, Any]:
        return {"id": self.id, "before": self.before, "after": self.after, "status": self.status}


@dataclass
class Comparison:
    """Two runs compared probe by probe (see :mod:`pytest_cachecheck.baseline`). Rows most important first."""

    rows: List[Row]
    counts: Dict[str, int]
    verdict: str
    why: str
    mcnemar_p: Optional[float]
    paired: int
    valid_in_both: int
    env_warnings: List[str] = field(default_factory=list)
    baseline_rate: Optional[Rate] = None
    current_rate: Optional[Rate] = None
    baseline_created: Optional[str] = None

    @property
    def b(self) -> int:
        """Discordant pairs same -> different."""
        return self.counts.get(NEWLY_DIVERGED, 0)

    @property
    def c(self) -> int:
        """Discordant pairs different -> same."""
        return self.counts.get(HEALED, 0)

    def newly_diverged(self) -> List[str]:
        return [r.id for r in self.rows if r.status == NEWLY_DIVERGED]

    def still_different(self) -> Set[str]:
        return {r.id for r in self.rows if r.status == STILL_DIFFERENT}

    def to_json(self) -> Dict[str, Any]:
        return {"verdict": self.verdict, "why": self.why, "mcnemar_p": self.mcnemar_p, "paired": self.paired,
                "valid_in_both": self.valid_in_both, "newly_diverged_count": self.b, "healed_count": self.c,
                "counts": dict(self.counts),
                "baseline_rate": self.baseline_rate.to_json() if self.baseline_rate else None,
                "current_rate": self.current_rate.to_json() if self.current_rate else None,
                "baseline_created": self.baseline_created, "env_warnings": list(self.env_warnings),
                "newly_diverged": self.newly_diverged(), "still_different": sorted(self.still_different()),
                "rows": [r.to_json() for r in self.rows]}

    @classmethod
    def from_json(cls, f: _Field) -> Optional["Comparison"]:
        if f.value is None:
            return None
        rows = [Row(r["id"].string(), r["before"].opt_string(), r["after"].opt_string(), r["status"].string())
                for r in f["rows"].opt_items()]
        counts = {k: int(v) for k, v in f["counts"].mapping().items() if isinstance(v, int)}
        return cls(rows, counts, f["verdict"].opt_string() or "inconclusive", f["why"].opt_string() or "",
                   f["mcnemar_p"].opt_float(), f["paired"].opt_integer() or 0, f["valid_in_both"].opt_integer() or 0,
                   f["env_warnings"].strings(), Rate.from_json(f["baseline_rate"]),
                   Rate.from_json(f["current_rate"]), f["baseline_created"].opt_string())


# -- targets and the run ----------------------------------------------------------------------------------
@dataclass
class ProbeSet:
    name: str
    count: int
    fingerprint: str

    def to_json(self) -> Dict[str, Any]:
        return {"name": self.name, "count": self.count, "fingerprint": self.fingerprint}

    @classmethod
    def from_json(cls, f: _Field) -> Optional["ProbeSet"]:
        if f.value is None:
            return None
        return cls(f["name"].opt_string() or "?", f["count"].opt_integer() or 0, f["fingerprint"].opt_string() or "")


@dataclass
class TargetReport:
    """What one server (one target of a matrix, or the only one) measured, and its own verdict."""

    name: Optional[str]  # None without a matrix
    url: Optional[str]  # without credentials
    setup: Setup
    summary: Summary
    probes: List[ProbeRecord] = field(default_factory=list)
    served: Optional[Dict[str, Any]] = None  # --cachecheck-serve's server, as serve.Served.describe()
    baseline: Optional[Comparison] = None
    vs_reference: Optional[Comparison] = None  # a matrix target compared with the first
    #: the episodes (None when the run had none configured), their summary and comparisons
    episodes: Optional[List[EpisodeRecord]] = None
    episode_summary: Optional[EpisodeSummary] = None
    episode_baseline: Optional[Comparison] = None
    episode_vs_reference: Optional[Comparison] = None

    def to_json(self) -> Dict[str, Any]:
        """The target's entry of a matrix report's ``targets``."""
        s = self.setup
        out: Dict[str, Any] = {"name": self.name, "url": self.url, "mode": s.mode,
                               "server": s.server.to_json() if s.server else None,
                               "nocache_server": s.nocache_server.to_json() if s.nocache_server else None,
                               "served": self.served, "hit_tolerance": s.hit_tolerance,
                               "setup_warnings": list(s.setup_warnings), "setup_checks": list(s.setup_checks),
                               "summary": self.summary.to_json()}
        if self.baseline is not None:
            out["baseline"] = self.baseline.to_json()
        if self.vs_reference is not None:
            out["vs_reference"] = self.vs_reference.to_json()
        out.update(self.episode_json(records=False))
        out.update(self.check_json())
        return out

    def check_tallies(self) -> Tuple[Optional[CheckTally], Optional[CheckTally]]:
        """The outcome checks of the probes and of the episodes (None where none had checks)."""
        return CheckTally.of(self.probes), CheckTally.of(self.episodes or [])

    def check_json(self) -> Dict[str, Any]:
        """``check_summary`` / ``episode_check_summary``: only where an item had checks."""
        probes, episodes = self.check_tallies()
        out: Dict[str, Any] = {}
        if probes is not None:
            out["check_summary"] = probes.to_json()
        if episodes is not None:
            out["episode_check_summary"] = episodes.to_json()
        return out

    def episode_json(self, records: bool) -> Dict[str, Any]:
        """The episode keys of a report: only when the run had episodes configured."""
        if self.episodes is None:
            return {}
        out: Dict[str, Any] = {"episode_summary": self.episode_summary.to_json() if self.episode_summary else None}
        if self.episode_baseline is not None:
            out["episode_baseline"] = self.episode_baseline.to_json()
        if self.episode_vs_reference is not None:
            out["episode_vs_reference"] = self.episode_vs_reference.to_json()
        if records:
            out["episodes"] = [e.to_json() for e in self.episodes]
        return out

    @classmethod
    def from_json(cls, f: _Field, probes: List[ProbeRecord],
                  episodes: Optional[List[EpisodeRecord]] = None) -> "TargetReport":
        setup = Setup(f["mode"].opt_string(), ServerDescription.from_json(f["server"]),
                      ServerDescription.from_json(f["nocache_server"]), f["hit_tolerance"].opt_integer(),
                      f["setup_warnings"].strings(), f["setup_checks"].strings())
        summary = (Summary.from_json(f["summary"]) if f["summary"].value is not None
                   else Summary(Tally.of(probes), Status.PASSED, ""))
        return cls(f["name"].opt_string() if f.has("name") else None, f["url"].opt_string() if f.has("url") else None,
                   setup, summary, probes,
                   f["served"].mapping() or None, Comparison.from_json(f["baseline"]),
                   Comparison.from_json(f["vs_reference"]), episodes, EpisodeSummary.from_json(f["episode_summary"]),
                   Comparison.from_json(f["episode_baseline"]), Comparison.from_json(f["episode_vs_reference"]))


@dataclass
class RunReport:
    """The whole run: settings, the probe set, one report per target, the verdict and the checks of
    ``cachecheck.check()``. Without a matrix there is one target, named None, and the JSON is flat."""

    settings: Dict[str, Any]  # Settings.public(): URLs without credentials, never the key
    probe_set: ProbeSet
    targets: List[TargetReport]
    summary: Summary
    created: str = ""
    checks: List[ProbeRecord] = field(default_factory=list)
    tool_version: str = __version__
    matrix: bool = False
    episode_set: Optional[ProbeSet] = None  # None: no episodes configured
    episode_checks: List[EpisodeRecord] = field(default_factory=list)  # of cachecheck.episode()

    @property
    def probes(self) -> List[ProbeRecord]:
        return [p for t in self.targets for p in t.probes]

    @property
    def episodes(self) -> List[EpisodeRecord]:
        return [e for t in self.targets for e in t.episodes or []]

    def target(self, name: Optional[str]) -> TargetReport:
        for t in self.targets:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_json(self) -> Dict[str, Any]:
        head: Dict[str, Any] = {"schema_version": SCHEMA_VERSION,
                                "tool": {"name": TOOL, "version": self.tool_version},
                                "created": self.created, "settings": self.settings}
        if not self.matrix:
            t = self.targets[0]
            s = t.setup
            out = {**head, "mode": s.mode, "server": s.server.to_json() if s.server else None,
                   "nocache_server": s.nocache_server.to_json() if s.nocache_server else None,
                   "probe_set": self.probe_set.to_json(), "served": t.served, "hit_tolerance": s.hit_tolerance,
                   "setup_warnings": list(s.setup_warnings), "setup_checks": list(s.setup_checks),
                   "summary": self.summary.to_json(), **t.check_json(), "probes": [p.to_json() for p in t.probes]}
            if t.baseline is not None:
                out["baseline"] = t.baseline.to_json()
            if self.episode_set is not None:
                out["episode_set"] = self.episode_set.to_json()
                out.update(t.episode_json(records=True))
        else:
            out = {**head, "probe_set": self.probe_set.to_json(), "mode": None, "server": None,
                   "nocache_server": None, "served": None, "hit_tolerance": None,
                   "setup_warnings": [f"{t.name}: {w}" for t in self.targets for w in t.setup.setup_warnings],
                   "setup_checks": [], "summary": self.summary.to_json(),
                   "targets": [t.to_json() for t in self.targets],
                   "probes": [p.to_json() for p in self.probes]}
            if self.episode_set is not None:
                out["episode_set"] = self.episode_set.to_json()
                out["episodes"] = [e.to_json() for e in self.episodes]
        if self.checks:
            out["checks"] = [c.to_json() for c in self.checks]
        if self.episode_checks:
            out["episode_checks"] = [c.to_json() for c in self.episode_checks]
        return out

    @classmethod
    def from_json(cls, data: Any) -> "RunReport":
        """Read a report written by ``--cachecheck-report``; raises ReportError naming what is wrong."""
        hint = "pass a file written by --cachecheck-report"
        if not isinstance(data, dict):
            raise ReportError(f"not a pytest-cachecheck report (the JSON is a {type(data).__name__}, not an "
                              f"object); {hint}")
        f = _Field(data, "")
        tool = data.get("tool")
        if isinstance(tool, dict) and tool.get("name") not in (None, TOOL):
            raise ReportError(f"not a pytest-cachecheck report (written by {str(tool.get('name'))[:80]!r}); {hint}")
        if "schema_version" not in data:
            raise ReportError(f"not a pytest-cachecheck report (no schema_version); {hint}")
        version = data["schema_version"]
        if version != SCHEMA_VERSION or isinstance(version, bool):
            raise ReportError(f"unsupported schema_version {repr(version)[:40]}; this version of pytest-cachecheck "
                              f"reads schema_version {SCHEMA_VERSION}")
        if not isinstance(data.get("probes"), list):
            raise ReportError(f"not a pytest-cachecheck report (no 'probes' list); {hint}")
        probes = [ProbeRecord.from_json(p.value, p.path) for p in f["probes"].items()]
        probe_set = ProbeSet.from_json(f["probe_set"]) or ProbeSet("?", len(probes), "")
        episode_set = ProbeSet.from_json(f["episode_set"])
        episodes = ([EpisodeRecord.from_json(e.value, e.path) for e in f["episodes"].opt_items()]
                    if episode_set is not None else None)
        created = f["created"].opt_string() or ""
        tool_version = str(tool.get("version")) if isinstance(tool, dict) and tool.get("version") else ""
        matrix = isinstance(data.get("targets"), list) and bool(data["targets"])
        if matrix:
            targets = []
            for t in f["targets"].items():
                name = t["name"].string()
                mine = [e for e in episodes if e.target == name] if episodes is not None else None
                targets.append(TargetReport.from_json(t, [p for p in probes if p.target == name], mine))
            names = {t.name for t in targets}
            kinds: List[Tuple[str, Sequence[Any]]] = [("probes", probes), ("episodes", episodes or [])]
            for kind, records in kinds:
                for i, r in enumerate(records):
                    if r.target not in names:
                        raise ReportError(f"field '{kind}[{i}].target': {str(r.target)[:60]!r} names none of "
                                          f"the report's targets")
        else:
            targets = [TargetReport.from_json(f, probes, episodes)]
        return cls(f["settings"].mapping(), probe_set, targets, Summary.from_json(f["summary"]) if
                   isinstance(data.get("summary"), dict) else targets[0].summary,
                   created, [ProbeRecord.from_json(c.value, c.path) for c in f["checks"].opt_items()],
                   tool_version, matrix, episode_set,
                   [EpisodeRecord.from_json(c.value, c.path) for c in f["episode_checks"].opt_items()])

