"""Run settings: one frozen dataclass, resolved once from command line, ini file and environment.

Every option is declared once, as an :class:`OptionSpec` of :data:`OPTIONS`: that table drives pytest's
registration (``plugin.pytest_addoption``), the parsing in :func:`resolve`, the reproduce line and the
docs table (:func:`options_markdown`). What must hold between options is :data:`RULES`, one sentence
each, checked once every option is parsed.

Precedence: command line, then ini key, then environment variable (where one exists), then default.
Every bad or conflicting value raises :class:`ConfigError` naming the option, the value and what is
allowed; the plugin turns that into ``pytest.UsageError`` before any request is sent.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import urlsplit, urlunsplit

from .errors import ConfigError
from .files import REPLACE, output_target
from .identity import server_groups
from .redact import MIN_SECRET, ambiguous_url, display_url, split_credentials

MODES = ("auto", "llama.cpp", "one-server", "two-servers")  # the first is the default
FAIL_POLICIES = ("new-divergence", "rate-increase", "never")  # the first is the default
GATE_ON = ("divergence", "flips")  # the first is the default
#: the probe and episode sets that ship with the plugin, by name instead of a path
PROBE_SETS = ("builtin", "tasks")
EPISODE_SETS = ("builtin", "tasks")
DEFAULT_MAX_TOKENS = 256
DEFAULT_TOLERANCE = 32
DEFAULT_TIMEOUT = 300.0
DEFAULT_MIN_VALID = 0.8


@dataclass(frozen=True)
class Settings:
    """Everything a run needs, validated; a field an option fills holds its default. The API key is kept
    out of ``repr``."""

    url: str
    mode: str = MODES[0]
    replicas: Tuple[str, ...] = ()  # every --cachecheck-url given; ``url`` is this process's one
    targets: Tuple[Tuple[str, str], ...] = ()  # (name, url) of a target matrix; ``url`` is the first's
    nocache_url: Optional[str] = None
    model: Optional[str] = None
    probe_files: Tuple[str, ...] = ()
    episode_files: Tuple[str, ...] = ()  # paths, or "builtin"
    n: Optional[int] = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    hit_tolerance: int = DEFAULT_TOLERANCE
    skip_hit_check: bool = False
    report: Optional[str] = None
    api_key: Optional[str] = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT
    min_valid: float = DEFAULT_MIN_VALID
    serve: Optional[str] = None
    server_args: Optional[str] = None
    html: Optional[str] = None
    baseline: Optional[str] = None
    fail_on: str = FAIL_POLICIES[0]
    max_rate: Optional[float] = None
    gate_on: str = GATE_ON[0]  # or "flips": only a flipped outcome check fails the run
    max_flip_rate: Optional[float] = None
    record: bool = False  # --cachecheck-record: ``report`` is a baseline being recorded
    logprobs: bool = True
    batch: Optional[int] = None  # background requests in flight with each measured one; None: no batch kind
    batch_prompt_words: int = 200
    batch_max_tokens: int = 256
    batch_seed: int = 0
    batch_lead: float = 0.2  # seconds between the last background request's start and the measured request
    order: bool = False  # --cachecheck-order: the order kind (order.py)
    order_between: int = 1  # other conversations sent before each probe of the order kind's pass B
    serve_cache_ram: int = 0  # --cache-ram (MiB) of the llama-server --cachecheck-serve starts
    load_cache: bool = False  # the loaded kind: the probe protocol with turn 2 amid the batch kind's background
    hit_tolerance_given: bool = False  # False: the default, which a server's larger block size raises
    notes: Tuple[str, ...] = ()  # what the plugin made of the values given, for the header

    def __repr__(self) -> str:
        """Like the generated one, with every URL as :func:`display_url` shows it and no key (a traceback
        with ``-l`` shows it)."""
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "api_key"}
        shown["url"] = display_url(self.url)
        shown["replicas"] = tuple(display_url(u) for u in self.replicas)
        shown["targets"] = tuple((n, display_url(u)) for n, u in self.targets)
        shown["nocache_url"] = display_url(self.nocache_url) if self.nocache_url else None
        shown["api_key_set"] = self.api_key is not None
        return "Settings(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"

    def public(self) -> Dict[str, Any]:
        """The settings as they may appear in a report: URLs without credentials, never the key."""
        return {
            "url": display_url(self.url),
            "replicas": [display_url(u) for u in self.replicas],
            "targets": [{"name": n, "url": display_url(u)} for n, u in self.targets],
            "mode": self.mode,
            "nocache_url": display_url(self.nocache_url) if self.nocache_url else None,
            "model": self.model,
            "probe_files": list(self.probe_files),
            "n": self.n,
            "max_tokens": self.max_tokens,
            "hit_tolerance": self.hit_tolerance,
            "skip_hit_check": self.skip_hit_check,
            "api_key_set": self.api_key is not None,
            "timeout": self.timeout,
            "min_valid": self.min_valid,
            "baseline": self.baseline,
            "fail_on": self.fail_on,
            "max_rate": self.max_rate,
            "record": self.record,
            "logprobs": self.logprobs,
            "serve": self.serve if self.serve in (None, "demo") else Path(self.serve).name,
            "server_args": self.server_args,
            **({"episode_files": list(self.episode_files)} if self.episode_files else {}),
            **({"gate_on": self.gate_on, "max_flip_rate": self.max_flip_rate} if self.gate_on != GATE_ON[0]
               else {}),
            **({"batch": self.batch, "batch_prompt_words": self.batch_prompt_words,
                "batch_max_tokens": self.batch_max_tokens, "batch_seed": self.batch_seed,
                "batch_lead": self.batch_lead}
               if self.batch is not None else {}),
            **({"order": True, "order_between": self.order_between} if self.order else {}),
            **({"serve_cache_ram": self.serve_cache_ram} if self.serve_cache_ram else {}),
            **({"load_cache": True} if self.load_cache else {}),
        }


Getter = Callable[[str], Any]
Parser = Callable[[str, Any, Path], Any]


@dataclass(frozen=True)
class OptionSpec:
    """One option, declared once; adding one is a spec here, a :class:`Settings` field and a README row.

    ``name``: the raw key; ini key and argparse dest ``cachecheck_<name>``. ``flag``, ``help`` (--help adds
    the env variable and the ini key). ``parse(name, value, base_dir)``: a value given (a str, a list for
    kind ``list``, a bool or number from a TOML ini; never None: an option not given keeps its default) ->
    the value of its Settings field; a bad one raises ``_bad(name, value, "what is allowed")``, naming the
    flag and ini key (rules between options go in :data:`RULES`). ``setting``: the field it fills (default
    ``name``), whose default is the option's. ``env``: read after command line and ini. ``kind``: ``str``,
    ``bool`` (a flag; in the ini true or false) or ``list`` (repeatable; in the ini one per line).
    ``metavar``: ``PATH`` marks a path (in the ini, relative to its folder). ``reproduced``: in the
    reproduce line when not its default. ``public``: in --help, the README and :func:`options_markdown`.
    ``shown``: how an error shows a bad value (a URL without its password, a key not at all).
    """

    name: str
    flag: str
    help: str
    parse: Parser
    setting: str = ""
    env: Optional[str] = None
    kind: str = "str"  # str | bool | list
    metavar: Optional[str] = None
    reproduced: bool = False
    public: bool = True
    shown: Optional[Callable[[Any], Any]] = None

    @property
    def ini(self) -> str:
        return "cachecheck_" + self.name

    @property
    def field(self) -> str:
        return self.setting or self.name

    @property
    def default(self) -> Any:
        return {f.name: f.default for f in dataclasses.fields(Settings)}[self.field]


def _bad(name: str, value: Any, allowed: str) -> ConfigError:
    spec = SPECS[name]
    shown = spec.shown(value) if spec.shown else value
    return ConfigError(f"{spec.flag} (ini {spec.ini}): {shown!r} is not allowed; expected {allowed}")


_AMBIGUOUS = ("a URL without '@' after its host (percent-encode '/', '?', '#' and '@' in a user name or "
              "password as %2F, %3F, %23 and %40, and '@' in a path or query as %40)")
def _url_problem(value: str) -> Optional[str]:
    """What is wrong with a server URL (as the 'expected ...' of a usage error), or None."""
    if ambiguous_url(value):
        return _AMBIGUOUS
    try:
        parts = urlsplit(value)
        hostname = parts.hostname
    except ValueError:
        return "an http:// or https:// URL with a host, e.g. http://127.0.0.1:8080"
    if parts.scheme not in ("http", "https") or not hostname:
        return "an http:// or https:// URL with a host, e.g. http://127.0.0.1:8080"
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        return "a URL whose port is a number from 1 to 65535"
    if parts.fragment:
        return "a URL without a #fragment"
    _, creds = split_credentials(value)
    if creds and creds[1] and len(creds[1]) < MIN_SECRET:
        return (f"a URL whose password has at least {MIN_SECRET} characters (a shorter one cannot be kept "
                f"out of the output without masking ordinary words)")
    return None


def _url(name: str, value: str) -> str:
    problem = _url_problem(value.strip())
    if problem:
        raise _bad(name, value, problem)
    return _without_v1(value.strip().rstrip("/"))


def _without_v1(url: str) -> str:
    """The server's root for an OpenAI client's base URL (``http://host:8000/v1``): the plugin asks for
    ``/v1/chat/completions`` (and root endpoints such as ``/metrics``) itself."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        return url
    return urlunsplit(parts._replace(path=path[:-3])).rstrip("/")


def _v1_notes(raw: Mapping[str, Any], targets: Sequence[Tuple[str, str]]) -> Tuple[str, ...]:
    """A note for each URL given with /v1 at its end, which the plugin took off."""
    given = [("--cachecheck-url", u.strip()) for u in _listed(raw.get("url"))]
    if raw.get("nocache_url"):
        given.append(("--cachecheck-nocache-url", str(raw["nocache_url"]).strip()))
    if targets:
        given = [(f"--cachecheck-target {e.strip().partition('=')[0]}=", e.strip().partition("=")[2].strip())
                 for e in _listed(raw["target"])]
    notes = []
    for flag, url in given:
        root = _without_v1(url.rstrip("/"))
        if root != url.rstrip("/"):
            sep = "" if flag.endswith("=") else " "
            notes.append(f"{flag}{sep}{display_url(url)} ends in /v1 (an OpenAI client's base URL); the "
                         f"plugin uses the server's root {display_url(root)} and asks for /v1/... itself")
    return tuple(notes)



def _api_key(name: str, value: Any, base: Path) -> Optional[str]:
    """The API key, refused (never shown) when a header cannot carry it or output cannot mask it."""
    if value == "":
        return None
    key = str(value)
    if not all("\x21" <= c <= "\x7e" for c in key):
        raise _bad(name, key, "printable ASCII without spaces or line breaks (an HTTP header cannot "
                              "carry the key as given; look for a stray newline)")
    if len(key) < MIN_SECRET:
        raise _bad(name, key, f"a key of at least {MIN_SECRET} characters (a shorter one cannot be "
                              f"kept out of the output without masking ordinary words)")
    return key


def _number(low: float, high: float, *, whole: bool = False, low_open: bool = False) -> Parser:
    def parse(name: str, value: Any, base: Path) -> float:
        try:
            number = (int if whole else float)(str(value).strip())
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and (number > low if low_open else number >= low) and number <= high):
            bound = f"greater than {low:g}" if low_open else f"at least {low:g}"
            raise _bad(name, value, f"a whole number from {low} to {high}" if whole
                       else f"a number {bound} and at most {high:g}")
        return number
    return parse


def _bool(name: str, value: Any, base: Path) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise _bad(name, value, "true or false")


def _choice(choices: Tuple[str, ...]) -> Parser:
    """One of ``choices``; an empty value is the first, the default."""
    def parse(name: str, value: Any, base: Path) -> str:
        text = str(value or choices[0]).strip()
        if text not in choices:
            raise _bad(name, text, "one of " + ", ".join(choices))
        return text
    return parse


def _text(allowed: str) -> Parser:
    def parse(name: str, value: Any, base: Path) -> str:
        if not str(value).strip():
            raise _bad(name, value, allowed)
        return str(value).strip()
    return parse


def _path(name: str, value: Any, base: Path, allowed: str = "a path whose ~user exists") -> str:
    """An input file's path: ``~`` expanded, a relative one from ``base``."""
    try:
        path = Path(str(value)).expanduser()
    except RuntimeError:
        raise _bad(name, value, allowed) from None
    return str(path if path.is_absolute() else base / path)


def _paths(name: str, value: Any, base: Path) -> Tuple[str, ...]:
    """Input files, or the name of a set that ships with the plugin (:data:`PROBE_SETS`, :data:`EPISODE_SETS`)."""
    sets = EPISODE_SETS if name == "episodes" else PROBE_SETS
    allowed = "a path whose ~user exists, " + ", ".join(repr(n) for n in sets[:-1]) + f" or {sets[-1]!r}"
    return tuple(f if f in sets else _path(name, f, base, allowed) for f in _listed(value))


def _output(name: str, value: Any, base: Path) -> Optional[str]:
    """An output file given by --cachecheck-report or --cachecheck-record, which may not be empty."""
    if not str(value).strip():
        raise _bad(name, value, "a file path, not an empty value")
    return _writable_report(str(value), base, name) if value else None


def _writable_report(value: str, base: Path, name: str) -> str:
    if not value.strip() or value.endswith(("/", os.sep)):
        raise _bad(name, value, "a file path (not empty, not ending in a path separator)")
    path = Path(_path(name, value, base))
    if path.is_dir():
        raise _bad(name, value, "a file path, not a directory")
    try:
        real, kind = output_target(str(path))
    except OSError as exc:
        raise _bad(name, value, f"a path to write to ({exc.strerror})") from None
    if kind != REPLACE:  # written through: no temporary file, no directory to write in
        if not os.access(real, os.W_OK):
            raise _bad(name, value, f"a writable {kind} ({real}: permission denied)")
        return str(path)
    parent = Path(real).parent  # a symlink's target is replaced: beside it goes the temporary file
    if not parent.is_dir():
        raise _bad(name, value, f"a path in an existing directory ({parent} does not exist)")
    try:
        fd, probe = tempfile.mkstemp(prefix=".cachecheck-", dir=str(parent))
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise _bad(name, value, f"a path in a writable directory ({parent}: {exc.strerror})") from None
    return str(path)



def _listed(value: Any) -> List[str]:
    """A list option's values (an ini value may be one whitespace-separated line)."""
    if not value:
        return []
    return str(value).split() if isinstance(value, str) else [str(v) for v in value]


def _replicas(name: str, value: Any, base: Path) -> Tuple[str, ...]:
    """Every --cachecheck-url: servers of their own."""
    urls = _listed(value)
    replicas = tuple(_url(name, u) for u in urls)
    shared = [g for g in server_groups(replicas) if len(g) > 1] if len(replicas) > 1 else []
    if shared:
        a, b = (display_url(urls[i].strip()) for i in shared[0][:2])  # as written
        raise ConfigError(f"--cachecheck-url (ini cachecheck_url): {a!r} and {b!r} reach one server (the "
                          f"same address, port and path); replicas must be servers of their own: each "
                          f"xdist worker sends to its one, and requests sent to one server in parallel are "
                          f"batched together, which changes answers")
    return replicas


_TARGET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,39}")


def _targets(name: str, value: Any, base: Path) -> Tuple[Tuple[str, str], ...]:
    """``NAME=URL`` entries of a target matrix, validated: names unique and short, URLs unique."""
    out: List[Tuple[str, str]] = []
    for entry in _listed(value):
        target, sep, url = entry.strip().partition("=")
        if not sep or not _TARGET_NAME.fullmatch(target):
            raise _bad(name, entry, "NAME=URL, where NAME is 1-40 letters, digits, '.', '_', '+' or '-' "
                       "starting with a letter or digit (e.g. f16=http://127.0.0.1:8080)")
        problem = _url_problem(url.strip())
        if problem:
            raise _bad(name, entry, f"NAME=URL with {problem}")
        url = _without_v1(url.strip().rstrip("/"))
        if any(n == target for n, _ in out):
            raise _bad(name, entry, f"a different name for each target ({target!r} is given twice)")
        if any(u == url for _, u in out):
            raise _bad(name, entry, "a different server for each target (this URL is given twice)")
        out.append((target, url))
    return tuple(out)


def _shown_url(value: Any) -> str:
    return display_url(str(value).strip())


def _shown_target(value: Any) -> str:
    """NAME=URL without the URL's password; without a valid NAME, all of it may be a URL (its query
    holds '=')."""
    name, sep, url = str(value).strip().partition("=")
    named = sep and _TARGET_NAME.fullmatch(name)
    return name + "=" + display_url(url.strip()) if named else _shown_url(value)


OPTIONS: Tuple[OptionSpec, ...] = (
    OptionSpec("url", "--cachecheck-url", "the server under test; turns the plugin on. Give it several times "
               "for replicas of one deployment: with pytest-xdist -n N each worker owns one", _replicas,
               "replicas", "CACHECHECK_URL", kind="list", metavar="URL", reproduced=True, shown=_shown_url),
    OptionSpec("target", "--cachecheck-target",
               "NAME=URL: a server of a target matrix (e.g. f16=http://host:8080); give it once per target "
               "to run every probe on each and compare their rates side by side; replaces --cachecheck-url",
               _targets, "targets", kind="list", metavar="NAME=URL", reproduced=True, shown=_shown_target),
    OptionSpec("mode", "--cachecheck-mode", "auto (default), llama.cpp, one-server or two-servers",
               _choice(MODES), metavar="MODE", reproduced=True),
    OptionSpec("nocache_url", "--cachecheck-nocache-url",
               "the server with prefix caching off (two-servers mode)",
               lambda n, v, b: _url(n, str(v)) if v else None, metavar="URL", reproduced=True,
               shown=_shown_url),
    OptionSpec("model", "--cachecheck-model",
               "the model to measure, checked before any probe request: one /v1/models lists (default: the "
               "only one); on llama-server one of its model's names: an --alias, or its file name with or "
               "without .gguf (default: its file name)",
               _text("a non-empty model name"), metavar="NAME", reproduced=True),
    OptionSpec("probes", "--cachecheck-probes",
               "JSONL or JSON-array probe file; may be given more than once (default: the 20 built-in "
               "conversations)", _paths, "probe_files", kind="list", metavar="PATH", reproduced=True),
    OptionSpec("episodes", "--cachecheck-episodes",
               "episodes (multi-step conversations with tool calls) to run besides the probes: a JSONL or "
               "JSON-array episode file, or 'builtin' for the 20 built-in ones; may be given more than once",
               _paths, "episode_files", kind="list", metavar="PATH", reproduced=True),
    OptionSpec("n", "--cachecheck-n", "run only the first N probes", _number(1, 1_000_000, whole=True),
               metavar="N", reproduced=True),
    OptionSpec("max_tokens", "--cachecheck-max-tokens",
               f"answer length in tokens (default {DEFAULT_MAX_TOKENS})",
               _number(1, 131072, whole=True), metavar="N", reproduced=True),
    OptionSpec("hit_tolerance", "--cachecheck-hit-tolerance",
               f"how many tokens short of turn-1 prompt + answer a cache hit may be (default "
               f"{DEFAULT_TOLERANCE})", _number(0, 1_000_000, whole=True), metavar="N", reproduced=True),
    OptionSpec("skip_hit_check", "--cachecheck-skip-hit-check",
               "do not require a cache hit on the cache path: the both-caches-off control in two-servers "
               "mode", lambda n, v, b: _bool(n, v or False, b), kind="bool", reproduced=True),
    OptionSpec("report", "--cachecheck-report", "write the JSON report to PATH", _output, metavar="PATH"),
    OptionSpec("html", "--cachecheck-html", "write a self-contained HTML page of the run to PATH",
               lambda n, v, b: _writable_report(str(v), b, n) if v else None, metavar="PATH"),
    OptionSpec("baseline", "--cachecheck-baseline",
               "compare with an earlier JSON report (probes paired by id)",
               lambda n, v, b: _path(n, v, b) if v else None, metavar="PATH"),
    OptionSpec("record", "--cachecheck-record",
               "record a baseline: write the JSON report to PATH; divergences are then expected failures, "
               "and the run passes when the measurement can be trusted (enough valid probes, no errors)",
               _output, metavar="PATH"),  # resolve() makes it the report, and ``record`` True
    OptionSpec("fail_on", "--cachecheck-fail-on",
               "with a baseline, when the session fails: new-divergence (default), rate-increase or never",
               _choice(FAIL_POLICIES), metavar="POLICY"),
    OptionSpec("max_rate", "--cachecheck-max-rate",
               "fail the session when the divergence rate (different / valid) exceeds R; divergent probes "
               "are then reported as expected failures", _number(0.0, 1.0), metavar="R"),
    OptionSpec("gate_on", "--cachecheck-gate-on",
               "what fails the run: divergence (default: any valid probe or episode whose paths differ) or "
               "flips (only those whose outcome checks, 'expect', pass on one path and fail on the other; a "
               "divergence that flips no check is then an expected failure)", _choice(GATE_ON), metavar="WHAT"),
    OptionSpec("max_flip_rate", "--cachecheck-max-flip-rate",
               "fail the session when flips / valid items with checks exceed R (implies --cachecheck-gate-on "
               "flips; flipped items are then reported as expected failures)", _number(0.0, 1.0), metavar="R"),
    OptionSpec("no_logprobs", "--cachecheck-no-logprobs",
               "do not ask for top-2 logprobs on turn-2 requests (they give each divergence its margin)",
               lambda n, v, b: not _bool(n, v or False, b), "logprobs", kind="bool", reproduced=True),
    OptionSpec("batch", "--cachecheck-batch",
               "also measure each probe amid N background requests in flight (the batch kind, items "
               "cachecheck::batch[...]; cache off on every request): does its answer change when the server "
               "has other work? Default: off", _number(1, 256, whole=True), metavar="N", reproduced=True),
    OptionSpec("batch_prompt_words", "--cachecheck-batch-prompt-words",
               "the words of each background request's prompt (with --cachecheck-batch; default 200)",
               _number(1, 100_000, whole=True), metavar="N", reproduced=True),
    OptionSpec("batch_max_tokens", "--cachecheck-batch-max-tokens",
               "the tokens each background request answers, up to (with --cachecheck-batch; default 256)",
               _number(1, 131072, whole=True), metavar="N", reproduced=True),
    OptionSpec("batch_seed", "--cachecheck-batch-seed",
               "the seed the background requests' prompts are generated from (with --cachecheck-batch; "
               "default 0)", _number(0, 2**31 - 1, whole=True), metavar="N", reproduced=True),
    OptionSpec("batch_lead", "--cachecheck-batch-lead",
               "seconds the measured request waits after every background request is on its way, so that the "
               "server has them in flight (with --cachecheck-batch; default 0.2)", _number(0.0, 60.0),
               metavar="SECONDS", reproduced=True),
    OptionSpec("order", "--cachecheck-order",
               "also send the probe set as an application would (no cache control fields: the server's own "
               "defaults), twice: in file order, then reversed with other conversations between (the order "
               "kind, items cachecheck::order[...]): does an answer change with the order and the state "
               "earlier conversations left? Default: off", lambda n, v, b: _bool(n, v or False, b),
               kind="bool", reproduced=True),
    OptionSpec("order_between", "--cachecheck-order-between",
               "the other conversations sent before each probe of the reversed pass (with "
               "--cachecheck-order; default 1)", _number(0, 64, whole=True), metavar="N", reproduced=True),
    OptionSpec("load_cache", "--cachecheck-load-cache",
               "also measure the cache under load: each probe's cache and recompute paths with every turn-2 "
               "request amid the --cachecheck-batch background (the loaded kind, items cachecheck::loaded[...]); "
               "needs --cachecheck-batch N. Default: off",
               lambda n, v, b: _bool(n, v or False, b), kind="bool", reproduced=True),
    OptionSpec("api_key", "--cachecheck-api-key", "sent as a bearer token to every server (at least 8 "
               "printable ASCII characters)", _api_key, env="CACHECHECK_API_KEY", metavar="KEY",
               shown=lambda v: "***"),
    OptionSpec("serve", "--cachecheck-serve",
               "start llama-server for the run with this model (a .gguf file, or 'demo' for a tiny "
               "random-weight model) instead of giving --cachecheck-url",
               _text("a path to a .gguf model file, or 'demo'"), metavar="MODEL", reproduced=True),
    OptionSpec("server_args", "--cachecheck-server-args",
               "extra llama-server flags for --cachecheck-serve, as one quoted string joined with '=' "
               "(--cachecheck-server-args='-c 8192': a separate value starting with '-' reads as an option)",
               lambda n, v, b: v or None, metavar="ARGS", reproduced=True),
    OptionSpec("serve_cache_ram", "--cachecheck-serve-cache-ram",
               "the host-memory prompt cache (llama-server --cache-ram, MiB) of the server "
               "--cachecheck-serve starts (default 0: off; on, the setup check's host-cache problem is a warning, and only with "
               "--cachecheck-order)", _number(0, 1_048_576, whole=True), metavar="MIB", reproduced=True),
    OptionSpec("timeout", "--cachecheck-timeout",
               f"a deadline in seconds for each whole request (default {DEFAULT_TIMEOUT:g})",
               _number(0.0, 86400.0, low_open=True), metavar="SECONDS"),
    OptionSpec("min_valid", "--cachecheck-min-valid",
               f"fraction of probes that must be valid for a pass (default {DEFAULT_MIN_VALID})",
               _number(0.0, 1.0), metavar="FRACTION"),
)
SPECS: Dict[str, OptionSpec] = {o.name: o for o in OPTIONS}

#: What must hold between options, one sentence each: (broken(settings, raw values), the error, formatted
#: with ``s``, the settings). Checked in this order once every option is parsed.
BATCH_SHAPE_OPTIONS = ("batch_prompt_words", "batch_max_tokens", "batch_seed", "batch_lead")
Rule = Tuple[Callable[[Settings, Mapping[str, Any]], Any], str]
RULES: Tuple[Rule, ...] = (
    (lambda s, raw: s.serve and (_listed(raw.get("url")) or raw.get("nocache_url") or _listed(raw.get("target"))),
     ("--cachecheck-serve starts its own llama-server; it conflicts with --cachecheck-url, --cachecheck-target "
      "and --cachecheck-nocache-url (ini or CACHECHECK_URL)")),
    (lambda s, raw: s.targets and _listed(raw.get("url")),
     ("--cachecheck-target (ini cachecheck_target) names every server of a target matrix; it conflicts with "
      "--cachecheck-url (ini cachecheck_url, env CACHECHECK_URL): give the first server as a target too")),
    (lambda s, raw: s.targets and (s.mode == "two-servers" or s.nocache_url),
     ("--cachecheck-target runs each target in llama.cpp or one-server mode; two-servers mode "
      "(--cachecheck-nocache-url) takes one pair of servers per run")),
    (lambda s, raw: s.nocache_url and s.mode in ("llama.cpp", "one-server"),
     "--cachecheck-nocache-url is for two-servers mode; it conflicts with --cachecheck-mode {s.mode}"),
    (lambda s, raw: len(s.replicas) > 1 and (s.mode == "two-servers" or s.nocache_url),
     ("several --cachecheck-url (replicas) go with llama.cpp or one-server mode, not with "
      "--cachecheck-nocache-url")),
    (lambda s, raw: s.mode == "two-servers" and not s.nocache_url,
     "--cachecheck-mode two-servers needs --cachecheck-nocache-url, the server with prefix caching off"),
    (lambda s, raw: s.nocache_url and s.nocache_url == s.url,
     ("--cachecheck-nocache-url is the same URL as --cachecheck-url; two-servers mode needs a second server "
      "started with prefix caching off")),
    (lambda s, raw: s.skip_hit_check and s.mode != "two-servers",
     ("--cachecheck-skip-hit-check is only for the both-caches-off control in two-servers mode (give "
      "--cachecheck-nocache-url); the mode here is {s.mode}")),
    (lambda s, raw: s.server_args and not s.serve, "--cachecheck-server-args goes with --cachecheck-serve"),
    (lambda s, raw: raw.get("fail_on") and not s.baseline,
     "--cachecheck-fail-on goes with --cachecheck-baseline PATH"),
    (lambda s, raw: s.record and raw.get("report"),
     ("--cachecheck-record writes the JSON report itself; it conflicts with --cachecheck-report (ini "
      "cachecheck_report)")),
    (lambda s, raw: s.record and raw.get("baseline") is not None,
     ("--cachecheck-record records a baseline, where divergences do not fail the run; it conflicts with "
      "--cachecheck-baseline (ini cachecheck_baseline)")),
    (lambda s, raw: s.record and raw.get("max_rate") is not None,
     ("--cachecheck-record records a baseline, where divergences do not fail the run; it conflicts with "
      "--cachecheck-max-rate (ini cachecheck_max_rate)")),
    (lambda s, raw: s.record and raw.get("max_flip_rate") is not None,
     ("--cachecheck-record records a baseline, where divergences do not fail the run; it conflicts with "
      "--cachecheck-max-flip-rate (ini cachecheck_max_flip_rate)")),
    (lambda s, raw: s.batch is None and any(raw.get(k) is not None for k in BATCH_SHAPE_OPTIONS),
     ("--cachecheck-batch-prompt-words, --cachecheck-batch-max-tokens, --cachecheck-batch-seed and "
      "--cachecheck-batch-lead shape the batch measurement; they go with --cachecheck-batch N")),
    (lambda s, raw: s.batch is not None and s.mode == "two-servers",
     ("--cachecheck-batch measures on one server with its cache off; it conflicts with two-servers mode "
      "(--cachecheck-nocache-url)")),
    (lambda s, raw: not s.order and raw.get("order_between") is not None,
     "--cachecheck-order-between shapes the order measurement; it goes with --cachecheck-order"),
    (lambda s, raw: s.order and s.mode == "two-servers",
     ("--cachecheck-order measures one server as an application uses it; it conflicts with two-servers mode "
      "(--cachecheck-nocache-url)")),
    (lambda s, raw: raw.get("serve_cache_ram") is not None and not s.serve,
     ("--cachecheck-serve-cache-ram sets the server --cachecheck-serve starts; it goes with "
      "--cachecheck-serve")),
    (lambda s, raw: s.serve_cache_ram and not s.order,
     ("--cachecheck-serve-cache-ram turns on a cache that restores another conversation's state, which "
      "spoils the cache probes' clean start; it goes with --cachecheck-order, which measures what it does")),
    (lambda s, raw: s.load_cache and s.batch is None,
     ("--cachecheck-load-cache measures the cache amid the batch kind's background; it goes with "
      "--cachecheck-batch N (and its shape options)")),
    (lambda s, raw: s.max_flip_rate is not None and s.gate_on != "flips",
     "--cachecheck-max-flip-rate gates the run on flips; it conflicts with --cachecheck-gate-on divergence"),
)


#: the URL of --cachecheck-serve's server until it has started (nothing is sent to it)
SERVED_URL = "http://127.0.0.1:1"


class RawOptions(Dict[str, Any]):
    """The raw option values; its repr names only the options given (a traceback with -l shows it)."""

    def __repr__(self) -> str:
        return "RawOptions(given: " + ", ".join(k for k, v in self.items() if v is not None) + ")"


def ini_paths(name: str, value: Any, base: Path) -> Any:
    """An ini value of a path option with its relative paths made relative to ``base`` (the ini file's
    folder); other values as they are. A ``~`` path is left for the settings to expand."""
    if SPECS[name].metavar != "PATH" or value in (None, "", []):
        return value

    def one(path: str) -> str:
        text = str(path).strip()
        if not text or text in PROBE_SETS + EPISODE_SETS or text.startswith("~") or Path(text).is_absolute():
            return text  # "builtin", "tasks": the sets that ship with the plugin
        return str(base / text)

    return [one(v) for v in value] if isinstance(value, list) else one(value)


def lookup(cli: Getter, ini: Getter, env: Mapping[str, str]) -> Dict[str, Any]:
    """Raw values by precedence: command line, ini, environment. ``None`` where nothing was given."""
    raw: Dict[str, Any] = RawOptions()
    for spec in OPTIONS:
        value = cli(spec.name)
        if value in (None, [], False):
            value = ini(spec.name)
            if isinstance(value, str) and value.strip() == "":
                value = None
            if value is False or value == []:  # not `in`: a TOML 0 equals False
                value = None
        if value is None and spec.env:
            value = env.get(spec.env) or None
        raw[spec.name] = value
    return raw


def resolve(raw: Mapping[str, Any], *, base_dir: Path) -> Optional[Settings]:
    """Validate raw values into :class:`Settings`: each option by its spec, then :data:`RULES`. ``None``
    when no server is given (the plugin stays off, and reads nothing else). Under ``--cachecheck-serve`` the
    URL is :data:`SERVED_URL` until the server has started (``session.open_session`` sets it)."""
    if not _listed(raw.get("url")) and not _listed(raw.get("target")) and not raw.get("serve"):
        if raw.get("nocache_url"):
            raise ConfigError("--cachecheck-nocache-url: needs --cachecheck-url (ini cachecheck_url, "
                              "env CACHECHECK_URL), the server under test")
        return None
    values = {spec.field: spec.parse(spec.name, raw[spec.name], base_dir)
              for spec in OPTIONS if raw.get(spec.name) is not None}
    targets = values.get("targets", ())
    values.setdefault("replicas", (SERVED_URL,))  # only under --cachecheck-serve: the others give a server
    values["url"] = targets[0][1] if targets else values["replicas"][0]
    if targets:
        values["replicas"] = ()
    if values.get("mode", MODES[0]) == "auto" and values.get("nocache_url"):
        values["mode"] = "two-servers"
    if values.get("max_flip_rate") is not None and "gate_on" not in values:
        values["gate_on"] = "flips"  # a flip rate gates on flips
    record = values.pop("record", None)
    if record:
        values.update(report=record, record=True)
    settings = Settings(**values, hit_tolerance_given=raw.get("hit_tolerance") is not None,
                        notes=_v1_notes(raw, targets))
    for broken, message in RULES:
        if broken(settings, raw):
            raise ConfigError(message.format(s=settings))
    return settings


def reproduce_args(settings: Settings) -> Sequence[str]:
    """Command-line flags that reproduce this run, without secrets: how it chose its server, then every
    ``reproduced`` option whose value is not its default."""
    if settings.serve:
        args = [f"--cachecheck-serve={settings.serve}"]
        if settings.server_args:
            args.append(f"--cachecheck-server-args={settings.server_args!r}")
    else:
        args = ([f"--cachecheck-target={n}={display_url(u)}" for n, u in settings.targets]
                or [f"--cachecheck-url={display_url(u)}" for u in settings.replicas or (settings.url,)])
        args.append(f"--cachecheck-mode={settings.mode}")
    server = ("serve", "server_args", "url", "target", "mode")  # written above: how the run chose its server
    for spec in OPTIONS:
        value = getattr(settings, spec.field)
        if spec.reproduced and spec.name not in server and value != spec.default:
            values = value if spec.kind == "list" else [spec.shown(value) if spec.shown else value]
            args += [spec.flag] if spec.kind == "bool" else [f"{spec.flag}={v}" for v in values]
    return args


def options_markdown() -> str:
    """The public options as a Markdown table (flag, ini key, env variable, default, help), for the docs."""
    rows = ["| Option | ini key | env | default | what it does |", "|---|---|---|---|---|"]
    for spec in (spec for spec in OPTIONS if spec.public):
        default = None if isinstance(spec.default, bool) or spec.default in (None, ()) else spec.default
        shown = "" if default is None else f"`{default:g}`" if isinstance(default, float) else f"`{default}`"
        flag = f"`{spec.flag} {spec.metavar}`" if spec.metavar else f"`{spec.flag}`"
        cells = [flag + (" (repeatable)" if spec.kind == "list" else ""), f"`{spec.ini}`",
                 f"`{spec.env}`" if spec.env else "", shown, spec.help.replace("|", "\\|")]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def _same_file(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)  # hard links
    except OSError:
        return False


def check_outputs(settings: Settings, others: Mapping[str, Optional[str]]) -> None:
    """Refuse an output file that is also an input, or another output (``others``: other plugins' outputs
    by option, e.g. ``--junitxml``), comparing real paths with symlinks resolved. Raises ConfigError."""

    def name(key: str) -> str:
        return f"{SPECS[key].flag} (ini {SPECS[key].ini})" if key in SPECS else key

    outputs = [("report", settings.report), ("html", settings.html)] + list(others.items())
    inputs = [("probes", p) for p in settings.probe_files if p not in PROBE_SETS] + [("baseline", settings.baseline)]
    inputs += [("episodes", p) for p in settings.episode_files if p not in EPISODE_SETS]
    for i, (output, path) in enumerate(outputs):
        for other, other_path in outputs[i + 1:] + inputs:
            if path and other_path and _same_file(path, other_path):
                what = ("the output would overwrite the input" if (other, other_path) in inputs
                        else "one output would overwrite the other")
                raise ConfigError(f"{name(output)} and {name(other)} name the same file ({path}): {what}; "
                                  f"give each output a file of its own")


def server_args_mistake(argv: Sequence[str]) -> Optional[str]:
    """The usage error for ``--cachecheck-server-args "-c 8192"``: a separate value starting with '-' reads
    as an option of pytest's own (``-c`` its config file, ``-n`` xdist's), and argparse fails before any
    hook of the plugin runs, so the command line is read here, as the plugin registers its options."""
    for flag, value in zip(argv, argv[1:]):
        if flag == "--cachecheck-server-args" and value.startswith("-"):
            return (f"cachecheck: --cachecheck-server-args: the value {value!r} starts with '-', so pytest "
                    f"reads it as an option of its own; write it with '=': "
                    f"--cachecheck-server-args={shlex.quote(value)}")
    return None


def space_form_paths(argv: Sequence[str], rootdir: str, inifile: Optional[str]) -> List[str]:
    """Header notes for path options given as a separate word (``--cachecheck-baseline /abs/x.json``):
    pytest reads such a word as a test path while it chooses its rootdir and ini file, before any plugin's
    options are known (pytest's own rule), so it may pick another rootdir and miss the suite's ini file."""
    paths = [spec for spec in OPTIONS if spec.metavar == "PATH"]
    notes = []
    for flag, value in zip(argv, argv[1:]):
        spec = next((p for p in paths if p.flag == flag), None)
        if spec is not None and not value.startswith("-"):
            notes.append(f"cachecheck: note: {flag} {value}: pytest read {value!r} as a test path while choosing "
                         f"its rootdir ({rootdir}) and ini file ({inifile or 'none'}); write {flag}={value} to "
                         f"keep it out of that choice")
    return notes


def native_toml_table(path: Optional[Path]) -> Any:
    """``[tool.pytest]`` of a pyproject.toml, ``[pytest]`` of a pytest.toml; None when there is none."""
    if path is None or path.suffix != ".toml":
        return None
    try:
        try:
            import tomllib
        except ImportError:  # Python < 3.11, where pytest itself reads TOML with tomli
            import tomli as tomllib  # type: ignore[no-redef]
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (ImportError, OSError, ValueError):
        return None
    table = data.get("tool", {}).get("pytest") if path.name == "pyproject.toml" else data.get("pytest")
    return table if isinstance(table, dict) else None
