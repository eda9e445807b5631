"""Outcome checks: what a probe's or an episode's ``expect`` field asks of an answer, and whether the cache
flipped it.

``expect`` is one object of checks (all must pass) or a list of such objects (all must pass)::

    {"contains": "Paris"}
    {"regex": "^\\d+$", "not_contains": "sorry"}
    [{"number": {"value": 42, "tolerance": 0.5}}, {"json": {"required_keys": ["name"]}}]

======================  =================================================================================
``contains``             the answer contains this text
``not_contains``         the answer does not contain this text
``regex``                Python ``re.search`` finds the pattern (compiled when the file is read)
``equals``               the answer equals this text, whitespace runs taken as one space, ends trimmed
``number``               ``{"value": x, "tolerance": t}``: the first number in the answer is within t of x
``json``                 ``true``, or ``{"required_keys": [...]}``: the answer (whitespace trimmed, one
                         surrounding Markdown code fence taken off) parses as JSON (an object with the keys)
``one_of``               a list of labels: the whitespace-trimmed answer equals one of them
``tool_called``          episodes only: ``{"name": ..., "arguments": {...}, "step": n}``: a tool call of
                         that name whose arguments hold these (a subset, JSON values compared), at step n
                         (1-based, of the path) or at any step
======================  =================================================================================

A probe's checks read its turn-2 answer; an episode's text checks read the final answer (the last step's
text) and ``tool_called`` reads every step's tool calls. A check is evaluated on the first repetition of
each path of a valid item (the repetitions agree there). The result of each path is pass, or fail with
the first failing check and why; a test's own judge (``cachecheck.check(..., judge=fn)``) that raises
anything but AssertionError is an error of the check, never a flip.

Pure: no pytest, no HTTP. The loaders (:mod:`.probes`, :mod:`.episodes`) call :func:`parse_expect` with
their error function, so every problem names the file, the line and the field.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .model import CheckResult, CheckResults, EpisodeRecord, ProbeRecord
from .text import printable

KINDS = ("contains", "not_contains", "regex", "equals", "number", "json", "one_of", "tool_called")
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\n(.*)\n```$", re.S)
#: the error function a loader passes: (field, problem) -> an exception naming its file and line
ErrorFn = Callable[[Optional[str], str], Exception]


def _q(text: str, limit: int = 60) -> str:
    """Text from a file or an answer as a check's description or reason shows it: quoted, one line."""
    return repr(printable(text, limit))


@dataclass(frozen=True)
class Answer:
    """What a path answered: the text checks read, and the tool calls ``(step, name, arguments)``."""

    text: str
    calls: Tuple[Tuple[int, str, str], ...] = ()


@dataclass(frozen=True)
class Check:
    """One check: its kind and its parameters as read from the file."""

    kind: str
    text: str = ""  # contains, not_contains, regex, equals; tool_called: the tool's name
    pattern: Optional["re.Pattern[str]"] = field(default=None, compare=False)
    value: float = 0.0  # number
    tolerance: float = 0.0
    keys: Tuple[str, ...] = ()  # json: required keys
    labels: Tuple[str, ...] = ()  # one_of
    arguments: str = ""  # tool_called: the arguments asked for, as JSON text
    step: Optional[int] = None  # tool_called

    def describe(self) -> str:
        if self.kind in ("contains", "not_contains", "equals", "regex"):
            return f"{self.kind} {_q(self.text)}"
        if self.kind == "number":
            return f"number {self.value:g} ± {self.tolerance:g}"
        if self.kind == "json":
            return "json" + (" with keys " + ", ".join(_q(k, 40) for k in self.keys) if self.keys else "")
        if self.kind == "one_of":
            return "one of " + ", ".join(_q(label, 40) for label in self.labels)
        call = f"tool_called {_q(self.text, 64)}" + (f" with {printable(self.arguments, 80)}" if self.arguments
                                                     else "")
        return call + (f" at step {self.step}" if self.step is not None else "")

    def failure(self, answer: Answer) -> Optional[str]:
        """Why the answer fails this check, or None when it passes."""
        text = answer.text
        if self.kind == "contains":
            return None if self.text in text else "not in the answer"
        if self.kind == "not_contains":
            return None if self.text not in text else f"found at character {text.index(self.text)}"
        if self.kind == "regex":
            assert self.pattern is not None
            return None if self.pattern.search(text) else "no match in the answer"
        if self.kind == "equals":
            got = " ".join(text.split())
            return None if got == " ".join(self.text.split()) else f"the answer is {_q(got)}"
        if self.kind == "number":
            found = _NUMBER.search(text)
            if found is None:
                return "no number in the answer"
            number = float(found.group())
            if math.isfinite(number) and abs(number - self.value) <= self.tolerance:
                return None
            return f"the first number is {found.group()}"
        if self.kind == "json":
            return _json_failure(text, self.keys)
        if self.kind == "one_of":
            return None if text.strip() in self.labels else f"the answer is {_q(text.strip())}"
        return _call_failure(self, answer.calls)


def _json_failure(text: str, keys: Sequence[str]) -> Optional[str]:
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    try:
        value = json.loads(body)
    except ValueError as exc:
        return f"not JSON ({str(exc)[:80]})"
    except RecursionError:
        return "not JSON (nested too deeply)"
    if not keys:
        return None
    if not isinstance(value, dict):
        return f"JSON, but not an object with the keys {', '.join(keys)}"
    missing = [k for k in keys if k not in value]
    return f"missing keys {', '.join(_q(k, 40) for k in missing)}" if missing else None


def _call_failure(check: Check, calls: Sequence[Tuple[int, str, str]]) -> Optional[str]:
    wanted = json.loads(check.arguments) if check.arguments else {}
    named = [(step, args) for step, name, args in calls
             if name == check.text and (check.step is None or step == check.step)]
    where = f" at step {check.step}" if check.step is not None else ""
    if not named:
        return f"no call of {_q(check.text, 64)}{where}" + ("" if calls else " (no tool call at all)")
    for _, args in named:
        try:
            given = json.loads(args)
        except ValueError:
            continue
        if isinstance(given, dict) and all(k in given and given[k] == v for k, v in wanted.items()):
            return None
    return f"{check.text}{where} was called with {printable(named[0][1], 80)}"


@dataclass(frozen=True)
class Judge:
    """A test's own check (``cachecheck.check(..., judge=fn)``): ``fn(answer)`` returns a truth value or
    raises AssertionError (its message is the reason)."""

    fn: Callable[[str], Any] = field(compare=False)

    def describe(self) -> str:
        return f"judge {getattr(self.fn, '__qualname__', None) or type(self.fn).__name__}"

    def failure(self, answer: Answer) -> Optional[str]:
        try:
            ok = self.fn(answer.text)
        except AssertionError as exc:  # its first line: pytest's rewriting appends its explanation below
            return printable(str(exc).split("\n", 1)[0], 200) or "AssertionError"
        return None if ok else f"returned {printable(repr(ok), 40)}"


AnyCheck = Union[Check, Judge]


@dataclass(frozen=True)
class Expect:
    """The checks of one probe or episode, and the ``expect`` value as the file gave it (JSON text)."""

    checks: Tuple[AnyCheck, ...]
    spec: str = ""  # canonical JSON of the value read; empty for a test's judge alone

    def describe(self) -> List[str]:
        return [c.describe() for c in self.checks]

    def evaluate(self, answer: Answer) -> CheckResult:
        """Pass, or fail with the first failing check and why; a judge that raises anything but
        AssertionError makes the result an error (passed None)."""
        for check in self.checks:
            try:
                why = check.failure(answer)
            except Exception as exc:  # noqa: BLE001 - only a test's judge can raise here
                return CheckResult(passed=None, reason=f"{check.describe()} raised {type(exc).__name__}: "
                                         f"{printable(str(exc), 200)}")
            if why is not None:
                return CheckResult(passed=False, reason=f"`{check.describe()}` ({why})")
        return CheckResult(passed=True)

    def judge(self, record: Union[ProbeRecord, EpisodeRecord]) -> CheckResults:
        """The checks' result on each path of a valid record (the first repetition stands for its path);
        an invalid record gets none."""
        results = CheckResults(checks=self.describe())
        if record.valid:
            results.cache, results.recompute = (self.evaluate(a) for a in answers(record))
        return results

    def plus(self, *checks: AnyCheck) -> "Expect":
        return Expect(self.checks + tuple(checks), self.spec)


def answers(record: Union[ProbeRecord, EpisodeRecord]) -> Tuple[Answer, Answer]:
    """The cache path's and the recompute path's answers as the checks read them."""
    if isinstance(record, ProbeRecord):
        return Answer(record.cache_answer or ""), Answer(record.recompute_answer or "")
    out = []
    for name in ("cache-1", "recompute-1"):
        path = record.path(name)
        steps = path.steps if path is not None else []
        out.append(Answer(steps[-1].content if steps else "",
                          tuple((s.step, c.name, c.arguments) for s in steps for c in s.tool_calls)))
    return out[0], out[1]


# -- reading ``expect`` ------------------------------------------------------------------------------------
def parse_expect(value: Any, error: ErrorFn, *, episode: bool, where: str = "expect") -> Expect:
    """The checks of a decoded ``expect`` value (plain JSON: numbers as int or float); raises what ``error``
    makes, naming the field (``expect.regex``, ``expect[1].number.tolerance``, ...)."""
    groups = value if isinstance(value, list) else [value]
    if isinstance(value, list) and not value:
        raise error(where, "must not be an empty list")
    checks: List[Check] = []
    for i, group in enumerate(groups):
        base = f"{where}[{i}]" if isinstance(value, list) else where
        if not isinstance(group, dict):
            raise error(base, f"must be an object of checks ({', '.join(KINDS)}) or a list of such objects")
        if not group:
            raise error(base, "must name at least one check: " + ", ".join(KINDS))
        for kind, arg in group.items():
            if kind not in KINDS:  # named in the problem, quoted: a key from a file may hold anything
                raise error(base, f"unknown check {json.dumps(str(kind))[:66]}; the checks are " + ", ".join(KINDS))
            checks.append(_parse_check(kind, arg, error, f"{base}.{kind}", episode))
    return Expect(tuple(checks), json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":")))


def _text(arg: Any, error: ErrorFn, where: str) -> str:
    if not isinstance(arg, str):
        raise error(where, f"must be a string, got {type(arg).__name__}")
    if not arg:
        raise error(where, "must not be empty")
    return arg


def _number(arg: Any, error: ErrorFn, where: str) -> float:
    if isinstance(arg, bool) or not isinstance(arg, (int, float)) or not math.isfinite(arg):
        raise error(where, "must be a number")
    return float(arg)


def _parse_check(kind: str, arg: Any, error: ErrorFn, where: str, episode: bool) -> Check:
    if kind in ("contains", "not_contains", "equals"):
        return Check(kind, _text(arg, error, where))
    if kind == "regex":
        pattern = _text(arg, error, where)
        try:
            return Check(kind, pattern, re.compile(pattern))
        except re.error as exc:
            raise error(where, f"not a valid Python regular expression: {exc}") from None
    if kind == "number":
        if not isinstance(arg, dict) or "value" not in arg or set(arg) - {"value", "tolerance"}:
            raise error(where, 'must be {"value": x, "tolerance": t} (tolerance optional, default 0)')
        tolerance = _number(arg.get("tolerance", 0), error, f"{where}.tolerance")
        if tolerance < 0:
            raise error(f"{where}.tolerance", "must not be negative")
        return Check(kind, value=_number(arg["value"], error, f"{where}.value"), tolerance=tolerance)
    if kind == "json":
        if arg is True:
            return Check(kind)
        if not isinstance(arg, dict) or set(arg) != {"required_keys"}:
            raise error(where, 'must be true or {"required_keys": ["key", ...]}')
        keys = arg["required_keys"]
        if not isinstance(keys, list) or not keys:
            raise error(f"{where}.required_keys", "must be a non-empty list of strings")
        return Check(kind, keys=tuple(_text(k, error, f"{where}.required_keys[{i}]") for i, k in enumerate(keys)))
    if kind == "one_of":
        if not isinstance(arg, list) or not arg:
            raise error(where, "must be a non-empty list of labels")
        return Check(kind, labels=tuple(_text(x, error, f"{where}[{i}]").strip() for i, x in enumerate(arg)))
    assert kind == "tool_called", kind
    if not episode:
        raise error(where, "goes with episodes (a probe's turn-2 answer makes no tool call)")
    if not isinstance(arg, dict) or "name" not in arg or set(arg) - {"name", "arguments", "step"}:
        raise error(where, 'must be {"name": ..., "arguments": {...}, "step": n} (arguments and step '
                           'optional)')
    name = _text(arg["name"], error, f"{where}.name")
    args: Dict[str, Any] = arg.get("arguments", {})
    if not isinstance(args, dict):
        raise error(f"{where}.arguments", "must be an object (the arguments the call must hold)")
    step = arg.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 1):
        raise error(f"{where}.step", "must be a whole number from 1 (the path's step)")
    return Check(kind, name, arguments=json.dumps(args, ensure_ascii=False) if args else "", step=step)
