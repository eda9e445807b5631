"""Episodes: multi-step conversations, with tool calls, and the scripted world they run in.

An episode file is JSONL or one JSON array (read and checked as probe files are: every error names the
file, the line and the field). Each record::

    {"id": "trip-weather",
     "messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}],
     "tools": [{"type": "function", "function": {"name": "get_weather", "description": "...",
                                                  "parameters": {...}}}],
     "tool_results": {"get_weather": {"cases": [{"arguments": {"city": "Oslo"}, "result": "rain, 4 C"}],
                                      "default": "sunny, 20 C"}},
     "user_turns": ["And tomorrow?", "Thanks, book the train."],
     "tool_choice": "auto",
     "max_steps": 8}

``messages`` open the conversation and end with a user message; ``tools`` (optional) are OpenAI function
schemas; ``tool_results`` scripts the result of every tool: a fixed string, or cases keyed by the exact
arguments with a default; ``user_turns`` are the user's later turns, in order; ``tool_choice`` (optional)
is ``auto``, ``required``, ``none`` or a tool's name, for every step or as a list per step (later steps
``auto``); ``max_steps`` (default 12, at most 64) bounds the requests of one path.

A step is one request: the model answers; if it called tools, each call gets its scripted result as a
``tool`` message and the model answers again; otherwise the next user turn follows. The episode ends when
the user turns run out, or after ``max_steps``. The world is a pure function of the history, so a path
that repeats its answers repeats its whole trajectory.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from .probes import (MAX_ID_LENGTH, ProbeFileError, _describe, _key_name, _quote, _RecordChecker, plain_json,
                     read_expect, read_records, read_resource)

if TYPE_CHECKING:
    from .outcomes import Expect

EPISODE_ROLES = ("system", "developer", "user")
CHOICES = ("auto", "required", "none")
DEFAULT_MAX_STEPS = 12
MAX_STEPS = 64
_FIELDS = ("id", "messages", "tools", "tool_results", "user_turns", "tool_choice", "max_steps", "expect")
_BUILTIN = "builtin_episodes.jsonl"
#: the episode sets that ship with the plugin, by the name ``--cachecheck-episodes`` takes instead of a path
NAMED_SETS = {"builtin": _BUILTIN, "tasks": "tasks_episodes.jsonl"}


def canonical(obj: Any) -> str:
    """One text per JSON value: keys sorted, no spaces. Only for fingerprints and for matching a call's
    arguments to a case: what is sent keeps the file's key order (:func:`written`)."""
    return json.dumps(obj, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def written(obj: Any) -> str:
    """A JSON value as text with its keys in the order the file wrote them (sent as such: a chat template
    renders the keys in the order it gets them)."""
    return json.dumps(obj, ensure_ascii=False)


@dataclass(frozen=True)
class ToolScript:
    """What one tool returns: the result for exact arguments, else the default."""

    cases: Tuple[Tuple[str, str], ...] = ()  # (canonical arguments, result)
    default: Optional[str] = None

    def result(self, arguments: str) -> str:
        try:
            key = canonical(json.loads(arguments))
        except ValueError:
            key = None
        for args, result in self.cases:
            if args == key:
                return result
        if self.default is not None:
            return self.default
        return "error: no result for these arguments"

    def to_json(self) -> Any:
        if not self.cases:
            return self.default
        return {"cases": [{"arguments": json.loads(a), "result": r} for a, r in self.cases], "default": self.default}


@dataclass(frozen=True)
class Episode:
    """One episode: its opening, tools, scripted world and user turns."""

    id: str
    source: str
    messages: Tuple[Tuple[str, str], ...]
    user_turns: Tuple[str, ...] = ()
    tools: Tuple[str, ...] = ()  # each tool's schema as JSON text in the file's key order (:func:`written`)
    results: Tuple[Tuple[str, ToolScript], ...] = ()
    tool_choice: Tuple[str, ...] = ()  # per step; a single value stands for every step
    max_steps: int = DEFAULT_MAX_STEPS
    expect: Optional["Expect"] = None  # outcome checks of the final answer and the tool calls; not fingerprinted

    @property
    def tool_names(self) -> List[str]:
        return [json.loads(t)["function"]["name"] for t in self.tools]

    def tool_schemas(self) -> Optional[List[Dict[str, Any]]]:
        return [json.loads(t) for t in self.tools] or None

    def opening(self) -> List[Dict[str, Any]]:
        return [{"role": role, "content": content} for role, content in self.messages]

    def choice(self, step: int) -> Optional[Any]:
        """The ``tool_choice`` of a step (1-based), as an OpenAI request field; None without tools."""
        if not self.tools:
            return None
        if len(self.tool_choice) == 1:
            word = self.tool_choice[0]
        else:
            word = self.tool_choice[step - 1] if step <= len(self.tool_choice) else "auto"
        return word if word in CHOICES else {"type": "function", "function": {"name": word}}

    def result(self, name: str, arguments: str) -> str:
        """The world's answer to a tool call."""
        for tool, script in self.results:
            if tool == name:
                return script.result(arguments)
        return f"error: there is no tool named {name}"

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"id": self.id, "messages": self.opening()}
        if self.tools:
            out["tools"] = [json.loads(t) for t in self.tools]
            out["tool_results"] = {name: script.to_json() for name, script in self.results}
        out["user_turns"] = list(self.user_turns)
        if self.tool_choice:
            out["tool_choice"] = self.tool_choice[0] if len(self.tool_choice) == 1 else list(self.tool_choice)
        out["max_steps"] = self.max_steps
        if self.expect is not None:
            out["expect"] = json.loads(self.expect.spec)
        return out

    @property
    def fingerprint(self) -> str:
        """``sha256:<hex>`` of everything but the id, the source and the outcome checks (the trajectory's
        inputs)."""
        body = {k: v for k, v in self.to_json().items() if k not in ("id", "expect")}
        return "sha256:" + hashlib.sha256(canonical(body).encode("utf-8", "surrogatepass")).hexdigest()


def parse_episode(obj: object, *, path: str, line: int, default_id: str) -> Episode:
    """Validate one decoded record and build an :class:`Episode`; ProbeFileError names the field."""
    chk = _RecordChecker(path, line)
    if not isinstance(obj, dict):
        raise chk.error(None, f"each episode must be a JSON object, got {_describe(obj)}")
    chk.duplicate_keys(obj, "")
    for key in obj:
        if key not in _FIELDS:
            raise chk.error(_key_name(key), "unknown field; allowed fields are " + ", ".join(f"'{f}'" for f in _FIELDS))
    if "messages" not in obj:
        raise chk.error("messages", "missing required field")
    ident = chk.ident(obj["id"]) if "id" in obj else default_id
    messages = chk.messages(obj["messages"])
    for i, (role, _) in enumerate(messages):
        if role not in EPISODE_ROLES:
            raise chk.error(f"messages[{i}].role", f"an episode opens with {', '.join(EPISODE_ROLES)} messages; "
                            f"{_quote(role)} turns come from the model and the world")
    turns = obj.get("user_turns", [])
    if not isinstance(turns, list):
        raise chk.error("user_turns", f"must be a list of strings, got {_describe(turns)}")
    user_turns = tuple(chk.text(t, f"user_turns[{i}]") for i, t in enumerate(turns))

    tools_raw = obj.get("tools", [])
    if not isinstance(tools_raw, list):
        raise chk.error("tools", f"must be a list of function schemas, got {_describe(tools_raw)}")
    tools: List[str] = []
    names: List[str] = []
    for i, tool in enumerate(tools_raw):
        base = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise chk.error(base, 'must be {"type": "function", "function": {"name": ..., "parameters": {...}}}')
        fn = tool["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not name or len(name) > 64 or \
                not all(c.isascii() and (c.isalnum() or c in "_-") for c in name):
            raise chk.error(f"{base}.function.name", "must be 1-64 letters, digits, '_' or '-'")
        if name in names:
            raise chk.error(f"{base}.function.name", f"duplicate tool name {_quote(name)}")
        if "parameters" in fn and not isinstance(fn["parameters"], dict):
            raise chk.error(f"{base}.function.parameters", f"must be a JSON schema object, got {_describe(fn['parameters'])}")
        names.append(name)
        tools.append(written(plain_json(tool, path=path, line=line, field=base)))

    scripts_raw = obj.get("tool_results", {})
    if not isinstance(scripts_raw, dict):
        raise chk.error("tool_results", f"must be an object keyed by tool name, got {_describe(scripts_raw)}")
    results: List[Tuple[str, ToolScript]] = []
    for name in scripts_raw:
        if name not in names:
            raise chk.error(f"tool_results.{_key_name(name)}", "names no tool of 'tools'")
    for name in names:
        if name not in scripts_raw:
            raise chk.error(f"tool_results.{_key_name(name)}", "missing: every tool needs a scripted result")
        results.append((name, _script(chk, scripts_raw[name], f"tool_results.{_key_name(name)}", path, line)))

    choice_raw = obj.get("tool_choice")
    choices: Tuple[str, ...] = ()
    if choice_raw is not None:
        if not tools:
            raise chk.error("tool_choice", "goes with 'tools'")
        listed = choice_raw if isinstance(choice_raw, list) else [choice_raw]
        if not listed:
            raise chk.error("tool_choice", "must not be an empty list")
        for i, c in enumerate(listed):
            where = "tool_choice" if not isinstance(choice_raw, list) else f"tool_choice[{i}]"
            if not isinstance(c, str) or (c not in CHOICES and c not in names):
                raise chk.error(where, f"must be one of {', '.join(CHOICES)} or a tool's name ({', '.join(names)})")
        choices = tuple(listed)

    steps = obj.get("max_steps", None)
    max_steps = DEFAULT_MAX_STEPS
    if steps is not None:
        value = plain_json(steps, path=path, line=line, field="max_steps")
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_STEPS:
            raise chk.error("max_steps", f"must be a whole number from 1 to {MAX_STEPS}")
        max_steps = value
    expect = read_expect(obj, chk, episode=True) if "expect" in obj else None
    return Episode(ident, f"{path}:{line}", messages, user_turns, tuple(tools), tuple(results), choices, max_steps,
                   expect)


def _script(chk: _RecordChecker, value: object, where: str, path: str, line: int) -> ToolScript:
    if isinstance(value, str):
        return ToolScript(default=chk.text(value, where))
    if not isinstance(value, dict):
        raise chk.error(where, f"must be a string or {{\"cases\": [...], \"default\": ...}}, got {_describe(value)}")
    for key in value:
        if key not in ("cases", "default"):
            raise chk.error(f"{where}.{_key_name(key)}", "unknown key; allowed keys are 'cases' and 'default'")
    default = chk.text(value["default"], f"{where}.default") if value.get("default") is not None else None
    cases_raw = value.get("cases", [])
    if not isinstance(cases_raw, list):
        raise chk.error(f"{where}.cases", f"must be a list, got {_describe(cases_raw)}")
    cases: List[Tuple[str, str]] = []
    for i, case in enumerate(cases_raw):
        base = f"{where}.cases[{i}]"
        if not isinstance(case, dict) or set(case) != {"arguments", "result"}:
            raise chk.error(base, 'must be {"arguments": {...}, "result": "..."}')
        if not isinstance(case["arguments"], dict):
            raise chk.error(f"{base}.arguments", f"must be an object, got {_describe(case['arguments'])}")
        args = canonical(plain_json(case["arguments"], path=path, line=line, field=f"{base}.arguments"))
        if any(a == args for a, _ in cases):
            raise chk.error(f"{base}.arguments", "the same arguments appear in an earlier case")
        cases.append((args, chk.text(case["result"], f"{base}.result")))
    if default is None and not cases:
        raise chk.error(where, "needs 'cases' or a 'default'")
    return ToolScript(tuple(cases), default)


def _parse(records: Any, stem: str) -> List[Episode]:
    out: List[Episode] = []
    seen: Dict[str, str] = {}
    path = stem
    for path, line, obj in records:
        episode = parse_episode(obj, path=path, line=line, default_id=f"{stem}-{line}")
        if episode.id in seen:
            raise ProbeFileError(path, line, "id", f"duplicate id {_quote(episode.id, MAX_ID_LENGTH)}; first used at "
                                 f"{seen[episode.id]}")
        seen[episode.id] = episode.source
        out.append(episode)
    if not out:
        raise ProbeFileError(path, None, None, "file is empty (no episodes found)")
    return out


def load_episodes(paths: Sequence[str]) -> List[Episode]:
    """Episodes of several files (``builtin`` and ``tasks`` name the sets that ship with the plugin); ids unique
    across all."""
    out: List[Episode] = []
    seen: Dict[str, str] = {}
    for p in paths:
        if p == "builtin":
            episodes = builtin_episodes()
        elif p in NAMED_SETS:
            episodes = _parse(read_records(p, read_resource(NAMED_SETS[p])), p)
        else:
            episodes = _parse(read_records(p), Path(p).stem)
        for e in episodes:
            if e.id in seen:
                where, _, line = e.source.rpartition(":")
                raise ProbeFileError(where, int(line) if line.isdigit() else None, "id",
                                     f"duplicate id {_quote(e.id, MAX_ID_LENGTH)}; already used at {seen[e.id]}")
            seen[e.id] = e.source
            out.append(e)
    return out


_builtin: Optional[Tuple[Episode, ...]] = None


def builtin_episodes() -> List[Episode]:
    """The built-in episodes shipped in ``data/builtin_episodes.jsonl`` (source ``builtin:<line>``)."""
    global _builtin
    if _builtin is None:
        _builtin = tuple(_parse(read_records("builtin", read_resource(_BUILTIN)), "builtin"))
    return list(_builtin)


def builtin_tools() -> List[Dict[str, Any]]:
    """The tools of the built-in episodes, each once (by name, in order of first use)."""
    seen: Dict[str, Dict[str, Any]] = {}
    for e in builtin_episodes():
        for schema in e.tool_schemas() or []:
            seen.setdefault(schema["function"]["name"], schema)
    return list(seen.values())


def episode_set_fingerprint(episodes: Sequence[Episode]) -> str:
    return "sha256:" + hashlib.sha256(canonical([[e.id, e.fingerprint] for e in episodes]).encode()).hexdigest()
