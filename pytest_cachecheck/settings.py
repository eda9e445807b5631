"""Run settings: one frozen dataclass, resolved once from command line, ini file and environment.

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

MODES = ("auto", "llama.cpp", "one-server", "two-servers")
FAIL_POLICIES = ("new-divergence", "rate-increase", "never")
GATE_ON = ("divergence", "flips")
#: the probe and episode sets that ship with the plugin, by name instead of a path
PROBE_SETS = ("builtin", "tasks")
EPISODE_SETS = ("builtin", "tasks")
DEFAULT_MAX_TOKENS = 256
DEFAULT_TOLERANCE = 32
DEFAULT_TIMEOUT = 300.0
DEFAULT_MIN_VALID = 0.8


@dataclass(frozen=True)
class OptionSpec:
    """One setting: its command-line flag, ini key, environment variable and help text."""

    name: str
    flag: str
    help: str
    env: Optional[str] = None
    kind: str = "str"  # str | bool | list
    metavar: Optional[str] = None

    @property
    def ini(self) -> str:
        return "cachecheck_" + self.name


OPTIONS: Tuple[OptionSpec, ...] = (
    OptionSpec("url", "--cachecheck-url", "the server under test; turns the plugin on. Give it several times "
               "for replicas of one deployment: with pytest-xdist -n N each worker owns one", "CACHECHECK_URL",
               kind="list", metavar="URL"),
    OptionSpec("target", "--cachecheck-target",
               "NAME=URL: a server of a target matrix (e.g. f16=http://host:8080); give it once per target "
               "to run every probe on each and compare their rates side by side; replaces --cachecheck-url",
               kind="list", metavar="NAME=URL"),
    OptionSpec("mode", "--cachecheck-mode",
               "auto (default), llama.cpp, one-server or two-servers", metavar="MODE"),
    OptionSpec("nocache_url", "--cachecheck-nocache-url",
               "the server with prefix caching off (two-servers mode)", metavar="URL"),
    OptionSpec("model", "--cachecheck-model",
               "the model to measure, checked before any probe request: one /v1/models lists (default: the "
               "only one); on llama-server one of its model's names: an --alias, or its file name with or "
               "without .gguf (default: its file name)",
               metavar="NAME"),
    OptionSpec("probes", "--cachecheck-probes",
               "JSONL or JSON-array probe file; may be given more than once (default: the 20 built-in "
               "conversations)", kind="list", metavar="PATH"),
    OptionSpec("episodes", "--cachecheck-episodes",
               "episodes (multi-step conversations with tool calls) to run besides the probes: a JSONL or "
               "JSON-array episode file, or 'builtin' for the 20 built-in ones; may be given more than once",
               kind="list", metavar="PATH"),
    OptionSpec("n", "--cachecheck-n", "run only the first N probes", metavar="N"),
    OptionSpec("max_tokens", "--cachecheck-max-tokens", f"answer length in tokens (default {DEFAULT_MAX_TOKENS})",
               metavar="N"),
    OptionSpec("hit_tolerance", "--cachecheck-hit-tolerance",
               f"how many tokens short of turn-1 prompt + answer a cache hit may be (default "
               f"{DEFAULT_TOLERANCE})", metavar="N"),
    OptionSpec("skip_hit_check", "--cachecheck-skip-hit-check",
               "do not require a cache hit on the cache path: the both-caches-off control in two-servers "
               "mode", kind="bool"),
    OptionSpec("report", "--cachecheck-report", "write the JSON report to PATH", metavar="PATH"),
    OptionSpec("html", "--cachecheck-html", "write a self-contained HTML page of the run to PATH",
               metavar="PATH"),
    OptionSpec("baseline", "--cachecheck-baseline",
               "compare with an earlier JSON report (probes paired by id)", metavar="PATH"),
    OptionSpec("record", "--cachecheck-record",
               "record a baseline: write the JSON report to PATH; divergences are then expected failures, "
               "and the run passes when the measurement can be trusted (enough valid probes, no errors)",
               metavar="PATH"),
    OptionSpec("fail_on", "--cachecheck-fail-on",
               "with a baseline, when the session fails: new-divergence (default), rate-increase or never",
               metavar="POLICY"),
    OptionSpec("max_rate", "--cachecheck-max-rate",
               "fail the session when the divergence rate (different / valid) exceeds R; divergent probes "
               "are then reported as expected failures", metavar="R"),
    OptionSpec("gate_on", "--cachecheck-gate-on",
               "what fails the run: divergence (default: any valid probe or episode whose paths differ) or "
               "flips (only those whose outcome checks, 'expect', pass on one path and fail on the other; a "
               "divergence that flips no check is then an expected failure)", metavar="WHAT"),
    OptionSpec("max_flip_rate", "--cachecheck-max-flip-rate",
               "fail the session when flips / valid items with checks exceed R (implies --cachecheck-gate-on "
               "flips; flipped items are then reported as expected failures)", metavar="R"),
    OptionSpec("no_logprobs", "--cachecheck-no-logprobs",
               "do not ask for top-2 logprobs on turn-2 requests (they give each divergence its margin)",
               kind="bool"),
    OptionSpec("api_key", "--cachecheck-api-key", "sent as a bearer token to every server (at least 8 "
               "printable ASCII characters)",
               "CACHECHECK_API_KEY", metavar="KEY"),
    OptionSpec("serve", "--cachecheck-serve",
               "start llama-server for the run with this model (a .gguf file, or 'demo' for a tiny "
               "random-weight model) instead of giving --cachecheck-url", metavar="MODEL"),
    OptionSpec("server_args", "--cachecheck-server-args",
               "extra llama-server flags for --cachecheck-serve, as one quoted string joined with '=' "
               "(--cachecheck-server-args='-c 8192': a separate value starting with '-' reads as an option)",
               metavar="ARGS"),
    OptionSpec("timeout", "--cachecheck-timeout",
               f"a deadline in seconds for each whole request (default {DEFAULT_TIMEOUT:g})",
               metavar="SECONDS"),
    OptionSpec("min_valid", "--cachecheck-min-valid",
               f"fraction of probes that must be valid for a pass (default {DEFAULT_MIN_VALID})",
               metavar="FRACTION"),
)
SPECS: Dict[str, OptionSpec] = {o.name: o for o in OPTIONS}
#: options whose values are paths: in the ini file relative to its folder, as pytest's own ini paths
PATH_OPTIONS = ("probes", "episodes", "report", "html", "baseline", "record")


@dataclass(frozen=True)
class Settings:
    """Everything a run needs, validated. The API key is kept out of ``repr``."""

    url: str
    mode: str = "auto"
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
    fail_on: str = "new-divergence"
    max_rate: Optional[float] = None
    gate_on: str = "divergence"  # or "flips": only a flipped outcome check fails the run
    max_flip_rate: Optional[float] = None
    record: bool = False  # --cachecheck-record: ``report`` is a baseline being recorded
    logprobs: bool = True
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
            **({"gate_on": self.gate_on, "max_flip_rate": self.max_flip_rate} if self.gate_on != "divergence"
               else {}),
        }


Getter = Callable[[str], Any]


def _bad(name: str, value: Any, allowed: str) -> ConfigError:
    spec = SPECS[name]
    shown = display_url(str(value).strip()) if name in ("url", "nocache_url") else value
    if name == "target":  # NAME=URL; without a valid NAME, all of it may be a URL (its query holds '=')
        target_name, sep, target_url = str(value).strip().partition("=")
        named = sep and _TARGET_NAME.fullmatch(target_name)
        shown = (target_name + "=" + display_url(target_url.strip())) if named \
            else display_url(str(value).strip())
    if name == "api_key":
        shown = "***"
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
    urls = raw.get("url") or []
    given = [("--cachecheck-url", str(u).strip()) for u in (urls.split() if isinstance(urls, str) else urls)]
    if raw.get("nocache_url"):
        given.append(("--cachecheck-nocache-url", str(raw["nocache_url"]).strip()))
    if targets:
        entries = raw["target"].split() if isinstance(raw["target"], str) else [str(v) for v in raw["target"]]
        given = [(f"--cachecheck-target {e.strip().partition('=')[0]}=", e.strip().partition("=")[2].strip())
                 for e in entries]
    notes = []
    for flag, url in given:
        root = _without_v1(url.rstrip("/"))
        if root != url.rstrip("/"):
            sep = "" if flag.endswith("=") else " "
            notes.append(f"{flag}{sep}{display_url(url)} ends in /v1 (an OpenAI client's base URL); the "
                         f"plugin uses the server's root {display_url(root)} and asks for /v1/... itself")
    return tuple(notes)


def _api_key(value: Any) -> Optional[str]:
    """The API key, refused (never shown) when a header cannot carry it or output cannot mask it."""
    if value is None or value == "":
        return None
    key = str(value)
    if not all("\x21" <= c <= "\x7e" for c in key):
        raise _bad("api_key", key, "printable ASCII without spaces or line breaks (an HTTP header cannot "
                                   "carry the key as given; look for a stray newline)")
    if len(key) < MIN_SECRET:
        raise _bad("api_key", key, f"a key of at least {MIN_SECRET} characters (a shorter one cannot be "
                                   f"kept out of the output without masking ordinary words)")
    return key


def _int(name: str, value: Any, low: int, high: int) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise _bad(name, value, f"a whole number from {low} to {high}") from None
    if not low <= number <= high:
        raise _bad(name, value, f"a whole number from {low} to {high}")
    return number


def _float(name: str, value: Any, low: float, high: float, *, low_open: bool = False) -> float:
    try:
        number = float(str(value).strip())
    except ValueError:
        number = math.nan
    ok = math.isfinite(number) and (number > low if low_open else number >= low) and number <= high
    if not ok:
        bound = f"greater than {low:g}" if low_open else f"at least {low:g}"
        raise _bad(name, value, f"a number {bound} and at most {high:g}")
    return number


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise _bad(name, value, "true or false")


def _writable_report(value: str, base: Path, name: str = "report") -> str:
    if not value.strip() or value.endswith(("/", os.sep)):
        raise _bad(name, value, "a file path (not empty, not ending in a path separator)")
    try:
        path = Path(value).expanduser()
    except RuntimeError:
        raise _bad(name, value, "a path whose ~user exists") from None
    if not path.is_absolute():
        path = base / path
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


class RawOptions(Dict[str, Any]):
    """The raw option values; its repr names only the options given (a traceback with -l shows it)."""

    def __repr__(self) -> str:
        return "RawOptions(given: " + ", ".join(k for k, v in self.items() if v is not None) + ")"


def ini_paths(name: str, value: Any, base: Path) -> Any:
    """An ini value of a path option with its relative paths made relative to ``base`` (the ini file's
    folder); other values as they are. A ``~`` path is left for the settings to expand."""
    if name not in PATH_OPTIONS or value in (None, "", []):
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


def _listed(value: Any) -> List[str]:
    """A list option's values (an ini value may be one whitespace-separated line)."""
    if not value:
        return []
    return str(value).split() if isinstance(value, str) else [str(v) for v in value]


def resolve(raw: Mapping[str, Any], *, base_dir: Path) -> Optional[Settings]:
    """Validate raw values into :class:`Settings`; ``None`` when no URL is given (the plugin stays off)."""
    urls = raw.get("url")
    if isinstance(urls, str):
        urls = urls.split()
    targets = _targets(raw.get("target"))
    if targets:
        if urls:
            raise ConfigError("--cachecheck-target (ini cachecheck_target) names every server of a target "
                              "matrix; it conflicts with --cachecheck-url (ini cachecheck_url, env "
                              "CACHECHECK_URL): give the first server as a target too")
        urls = [targets[0][1]]
    if not urls:
        for name in ("nocache_url",):
            if raw.get(name):
                raise ConfigError(f"{SPECS[name].flag}: needs --cachecheck-url (ini cachecheck_url, "
                                  f"env CACHECHECK_URL), the server under test")
        return None
    url = urls[0]
    replicas = tuple(_url("url", str(u)) for u in urls)
    shared = [g for g in server_groups(replicas) if len(g) > 1] if len(replicas) > 1 else []
    if shared:
        a, b = (display_url(str(urls[i]).strip()) for i in shared[0][:2])  # as written
        raise ConfigError(f"--cachecheck-url (ini cachecheck_url): {a!r} and {b!r} reach one server (the "
                          f"same address, port and path); replicas must be servers of their own: each "
                          f"xdist worker sends to its one, and requests sent to one server in parallel are "
                          f"batched together, which changes answers")
    url = replicas[0]
    mode = str(raw.get("mode") or "auto").strip()
    if mode not in MODES:
        raise _bad("mode", mode, "one of " + ", ".join(MODES))
    if targets and (mode == "two-servers" or raw.get("nocache_url")):
        raise ConfigError("--cachecheck-target runs each target in llama.cpp or one-server mode; two-servers "
                          "mode (--cachecheck-nocache-url) takes one pair of servers per run")
    nocache = raw.get("nocache_url")
    nocache_url = _url("nocache_url", str(nocache)) if nocache else None
    if nocache_url and mode in ("llama.cpp", "one-server"):
        raise ConfigError(f"--cachecheck-nocache-url is for two-servers mode; it conflicts with "
                          f"--cachecheck-mode {mode}")
    if mode == "auto" and nocache_url:
        mode = "two-servers"
    if len(replicas) > 1 and (mode == "two-servers" or nocache_url):
        raise ConfigError("several --cachecheck-url (replicas) go with llama.cpp or one-server mode, not with "
                          "--cachecheck-nocache-url")
    if mode == "two-servers" and not nocache_url:
        raise ConfigError("--cachecheck-mode two-servers needs --cachecheck-nocache-url, the server with "
                          "prefix caching off")
    if nocache_url and nocache_url == url:
        raise ConfigError("--cachecheck-nocache-url is the same URL as --cachecheck-url; two-servers mode "
                          "needs a second server started with prefix caching off")
    skip = _bool("skip_hit_check", raw.get("skip_hit_check") or False)
    if skip and mode != "two-servers":
        raise ConfigError(f"--cachecheck-skip-hit-check is only for the both-caches-off control in "
                          f"two-servers mode (give --cachecheck-nocache-url); the mode here is {mode}")
    model = raw.get("model")
    if model is not None and not str(model).strip():
        raise _bad("model", model, "a non-empty model name")
    files = raw.get("probes") or ()
    if isinstance(files, str):
        files = files.split()
    probe_files = []
    for f in files:
        if f in PROBE_SETS:
            probe_files.append(f)
            continue
        try:
            p = Path(str(f)).expanduser()
        except RuntimeError:
            raise _bad("probes", f, "a path whose ~user exists") from None
        probe_files.append(str(p if p.is_absolute() else base_dir / p))
    episode_files = []
    for f in _listed(raw.get("episodes")):
        if f in EPISODE_SETS:
            episode_files.append(f)
            continue
        try:
            p = Path(str(f)).expanduser()
        except RuntimeError:
            raise _bad("episodes", f, "a path whose ~user exists, 'builtin' or 'tasks'") from None
        episode_files.append(str(p if p.is_absolute() else base_dir / p))
    n = raw.get("n")
    report = raw.get("report")
    if report is not None and not str(report).strip():
        raise _bad("report", report, "a file path, not an empty value")
    api_key = raw.get("api_key")
    serve = raw.get("serve")
    if serve is not None and not str(serve).strip():
        raise _bad("serve", serve, "a path to a .gguf model file, or 'demo'")
    if raw.get("server_args") and not serve:
        raise ConfigError("--cachecheck-server-args goes with --cachecheck-serve")
    fail_on = str(raw.get("fail_on") or "new-divergence").strip()
    if fail_on not in FAIL_POLICIES:
        raise _bad("fail_on", fail_on, "one of " + ", ".join(FAIL_POLICIES))
    if raw.get("fail_on") and not raw.get("baseline"):
        raise ConfigError("--cachecheck-fail-on goes with --cachecheck-baseline PATH")
    record = raw.get("record")
    if record is not None and not str(record).strip():
        raise _bad("record", record, "a file path, not an empty value")
    if record:
        if report:
            raise ConfigError("--cachecheck-record writes the JSON report itself; it conflicts with "
                              "--cachecheck-report (ini cachecheck_report)")
        for name in ("baseline", "max_rate", "max_flip_rate"):
            if raw.get(name) is not None:
                raise ConfigError(f"--cachecheck-record records a baseline, where divergences do not fail "
                                  f"the run; it conflicts with {SPECS[name].flag} (ini {SPECS[name].ini})")
        report = _writable_report(str(record), base_dir, "record")
    gate_on = str(raw.get("gate_on") or ("flips" if raw.get("max_flip_rate") is not None else "divergence")).strip()
    if gate_on not in GATE_ON:
        raise _bad("gate_on", gate_on, "one of " + ", ".join(GATE_ON))
    if raw.get("max_flip_rate") is not None and gate_on != "flips":
        raise ConfigError("--cachecheck-max-flip-rate gates the run on flips; it conflicts with "
                          "--cachecheck-gate-on divergence")
    baseline = raw.get("baseline")
    if baseline:
        bpath = Path(str(baseline)).expanduser()
        baseline = str(bpath if bpath.is_absolute() else base_dir / bpath)
    html = raw.get("html")
    return Settings(
        notes=_v1_notes(raw, targets),
        html=_writable_report(str(html), base_dir, "html") if html else None,
        baseline=baseline or None,
        fail_on=fail_on,
        max_rate=_float("max_rate", raw["max_rate"], 0.0, 1.0) if raw.get("max_rate") is not None else None,
        gate_on=gate_on,
        max_flip_rate=_float("max_flip_rate", raw["max_flip_rate"], 0.0, 1.0)
        if raw.get("max_flip_rate") is not None else None,
        logprobs=not _bool("no_logprobs", raw.get("no_logprobs") or False),
        hit_tolerance_given=raw.get("hit_tolerance") is not None,
        serve=str(serve).strip() if serve else None,
        server_args=raw.get("server_args") or None,
        url=url,
        replicas=() if targets else replicas,
        targets=targets,
        mode=mode,
        nocache_url=nocache_url,
        model=str(model).strip() if model is not None else None,
        probe_files=tuple(probe_files),
        episode_files=tuple(episode_files),
        n=_int("n", n, 1, 1_000_000) if n is not None else None,
        max_tokens=_int("max_tokens", raw["max_tokens"], 1, 131072)
        if raw.get("max_tokens") is not None else DEFAULT_MAX_TOKENS,
        hit_tolerance=_int("hit_tolerance", raw["hit_tolerance"], 0, 1_000_000)
        if raw.get("hit_tolerance") is not None else DEFAULT_TOLERANCE,
        skip_hit_check=skip,
        report=(report if record else _writable_report(str(report), base_dir)) if report else None,
        record=bool(record),
        api_key=_api_key(api_key),
        timeout=_float("timeout", raw["timeout"], 0.0, 86400.0, low_open=True)
        if raw.get("timeout") is not None else DEFAULT_TIMEOUT,
        min_valid=_float("min_valid", raw["min_valid"], 0.0, 1.0)
        if raw.get("min_valid") is not None else DEFAULT_MIN_VALID,
    )


_TARGET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,39}")


def _targets(value: Any) -> Tuple[Tuple[str, str], ...]:
    """``NAME=URL`` entries of a target matrix, validated: names unique and short, URLs unique."""
    if not value:
        return ()
    entries = value.split() if isinstance(value, str) else [str(v) for v in value]
    out: List[Tuple[str, str]] = []
    for entry in entries:
        name, sep, url = entry.strip().partition("=")
        if not sep or not _TARGET_NAME.fullmatch(name):
            raise _bad("target", entry, "NAME=URL, where NAME is 1-40 letters, digits, '.', '_', '+' or '-' "
                       "starting with a letter or digit (e.g. f16=http://127.0.0.1:8080)")
        problem = _url_problem(url.strip())
        if problem:
            raise _bad("target", entry, f"NAME=URL with {problem}")
        url = _without_v1(url.strip().rstrip("/"))
        if any(n == name for n, _ in out):
            raise _bad("target", entry, f"a different name for each target ({name!r} is given twice)")
        if any(u == url for _, u in out):
            raise _bad("target", entry, "a different server for each target (this URL is given twice)")
        out.append((name, url))
    return tuple(out)


def reproduce_args(settings: Settings) -> Sequence[str]:
    """Command-line flags that reproduce this run, without secrets."""
    if settings.serve:
        args = [f"--cachecheck-serve={settings.serve}"]
        if settings.server_args:
            args.append(f"--cachecheck-server-args={settings.server_args!r}")
    elif settings.targets:
        args = [f"--cachecheck-target={n}={display_url(u)}" for n, u in settings.targets]
        args.append(f"--cachecheck-mode={settings.mode}")
    else:
        args = [f"--cachecheck-url={display_url(u)}" for u in settings.replicas or (settings.url,)]
        args.append(f"--cachecheck-mode={settings.mode}")
    if settings.nocache_url:
        args.append(f"--cachecheck-nocache-url={display_url(settings.nocache_url)}")
    if settings.model:
        args.append(f"--cachecheck-model={settings.model}")
    args += [f"--cachecheck-probes={p}" for p in settings.probe_files]
    args += [f"--cachecheck-episodes={p}" for p in settings.episode_files]
    if settings.n is not None:
        args.append(f"--cachecheck-n={settings.n}")
    if settings.max_tokens != DEFAULT_MAX_TOKENS:
        args.append(f"--cachecheck-max-tokens={settings.max_tokens}")
    if settings.hit_tolerance != DEFAULT_TOLERANCE:
        args.append(f"--cachecheck-hit-tolerance={settings.hit_tolerance}")
    if settings.skip_hit_check:
        args.append("--cachecheck-skip-hit-check")
    if not settings.logprobs:
        args.append("--cachecheck-no-logprobs")
    return args


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
