"""The one corner that leans on pytest and pytest-xdist internals: the plugin's synthetic module of probe
items, their node ids, and where pytest-xdist runs them.

Requests sent to one server in parallel are batched together, and batching alone changes answers; so
every probe item of one server, and every test that uses the ``cachecheck`` fixture against it, must run
in one worker, in order. The plugin does not lean on ``--dist loadgroup`` (its grouping broke with a
pytest release): it gives pytest-xdist a scheduler of its own, which places the probes of each server in
one work unit and spreads everything else as the ``--dist`` the user chose would. Workers report which
of their tests use the fixture through a file in a folder the controller made, because the controller
collects nothing itself. The session checks afterwards that the placement held (``run.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Set, Tuple

import pytest

from . import _items
from .episodes import Episode
from .errors import ConfigError
from .identity import server_groups, server_identity
from .kinds import KINDS
from .model import record_key
from .probes import Probe
from .settings import Settings

if TYPE_CHECKING:
    from .session import CheckSession

MODULE = "cachecheck"  # the node id of the synthetic module of probe items
#: the kinds of item, named as their test functions in _items
PROBE, EPISODE, BATCH, LOADED, ORDER = (k.name for k in KINDS)
GATE_NODEID = f"{MODULE}::{_items.GATE}"
ITEM_PREFIXES = tuple(f"{MODULE}::{k.name}[" for k in KINDS)
#: kind -> the parameter its item's case comes in (a batch, loaded or order item's case is a probe too)
PARAMS = {PROBE: "cachecheck_probe", EPISODE: "cachecheck_episode", BATCH: "cachecheck_batch",
          LOADED: "cachecheck_loaded", ORDER: "cachecheck_order"}
FIXTURE = "cachecheck"
#: --dist modes the plugin's scheduler stands in for; ``each`` runs every test on every worker
DIST_MODES = ("load", "loadscope", "loadfile", "loadgroup", "worksteal")


def escaped(text: str) -> str:
    """A parametrize id as pytest shows it in node ids (non-ASCII and control characters escaped)."""
    return text.encode("unicode_escape").decode("ascii")


def nodeid(kind: str, key: str) -> str:
    """The node id of the probe or episode item of this record key (``record_key``)."""
    return f"{MODULE}::{kind}[{escaped(key)}]"


def item_key(item: pytest.Item) -> Optional[Tuple[str, str]]:
    """(kind, record key) of an item of any kind (a probe, episode, batch, loaded or order item); None for any
    other item."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    for kind, param in PARAMS.items():
        case = params.get(param)
        if isinstance(case, Episode if kind == EPISODE else Probe):  # every other kind measures a probe
            return kind, record_key(case.id, params.get("cachecheck_target"))
    return None


def nodeids(session: CheckSession) -> Dict[str, Tuple[str, str]]:
    """node id -> (kind, record key) of every probe and episode item the session has: what an xdist
    controller, which collects nothing itself, knows its workers' items by."""
    return {nodeid(k.name, key): (k.name, key) for k in KINDS for key in session.kind_keys(k)}


class ProbeModule(pytest.Module):
    """The plugin's own module of probe and episode items; only its ``probe`` and ``episode`` functions
    are collected."""

    functions: Tuple[str, ...] = ("probe",)  # and "episode" when the run has episodes

    def funcnamefilter(self, name: str) -> bool:
        return name in self.functions

    def classnamefilter(self, name: str) -> bool:
        return False


def collect_probe_items(session: pytest.Session, kinds: Sequence[str]) -> List[pytest.Item]:
    """The items of ``kinds`` (their names, in run order: probes, episodes, batch, ...), collected from the
    synthetic module and reported as its collection."""
    module = ProbeModule.from_parent(session, path=Path(_items.__file__), nodeid=MODULE, name=MODULE)
    module.functions = tuple(kinds)
    items: List[pytest.Item] = [i for i in module.collect() if isinstance(i, pytest.Item)]
    session.config.hook.pytest_collectreport(report=pytest.CollectReport(module.nodeid, "passed", None,
                                                                        list(items)))
    return items


def sends(item: pytest.Item) -> bool:
    """Whether running this item sends requests to a server: a probe, episode or batch item, or a test using
    the
    ``cachecheck`` fixture."""
    return item.nodeid.startswith(ITEM_PREFIXES) or FIXTURE in getattr(item, "fixturenames", ())


def item_target(item: pytest.Item) -> Optional[str]:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("cachecheck_target") if callspec is not None else None


# -- placement under pytest-xdist ------------------------------------------------------------------
class Placement:
    """Which work unit each test belongs to; one per session, on the controller and on each worker.

    One server: one unit for its probes and the fixture's tests. A target matrix: one unit per server, the
    targets that reach one server (:mod:`.identity`) sharing it, one after the other. A target matrix with a
    test that uses the fixture: one unit for every target's probes and the fixture's tests, since such a
    test may send to any target (``check(target=...)``), which is only known when it runs. Replicas: every
    worker owns a server of its own, so probes and tests may go anywhere.
    """

    def __init__(self, folder: str, targets: Sequence[Tuple[str, str]], replicas: bool) -> None:
        self.folder = folder
        self.targets = tuple(targets)  # (name, URL) of a target matrix; empty without one
        self.replicas = replicas
        self._fixture_users: Optional[Set[str]] = None
        self._target_units: Optional[Dict[str, str]] = None
        self._claims: Dict[str, IO[str]] = {}  # a key of a server's identity -> the lock file held for it

    # on a worker: which collected tests use the cachecheck fixture
    def write_fixture_users(self, worker: str, items: List[pytest.Item]) -> None:
        users = [i.nodeid for i in items if FIXTURE in getattr(i, "fixturenames", ())]
        path = Path(self.folder) / f"fixture-users-{worker}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(users), encoding="utf-8")
        os.replace(tmp, path)

    # on the controller
    def fixture_users(self) -> Set[str]:
        if self._fixture_users is None:
            found: Set[str] = set()
            for path in Path(self.folder).glob("fixture-users-*.json"):
                try:
                    found.update(json.loads(path.read_text(encoding="utf-8")))
                except (OSError, ValueError):
                    pass  # the run-time check still catches a test placed wrongly
            self._fixture_users = found
        return self._fixture_users

    def target_unit(self, target: str) -> str:
        """The work unit of a matrix target's probes: the first target that reaches its server names it."""
        if self._target_units is None:
            names = [name for name, _ in self.targets]
            groups = server_groups([url for _, url in self.targets])
            self._target_units = {names[i]: "cachecheck-server:" + names[g[0]] for g in groups for i in g}
        return self._target_units.get(target, "cachecheck-server:" + target)

    def server_unit(self, nodeid: str) -> Optional[str]:
        """The work unit of a test that sends to a server, or None for any other test."""
        prefix = next((p for p in ITEM_PREFIXES if nodeid.startswith(p)), None)
        if prefix is not None:
            if self.replicas and prefix == f"{MODULE}::{ORDER}[":
                return "cachecheck-order"  # the order items of one run measure one set, on one server
            if self.replicas:
                return "cachecheck-probe:" + nodeid  # each worker measures on a server of its own
            if self.targets and not self.fixture_users():
                return self.target_unit(nodeid[len(prefix):-1].rsplit("@", 1)[-1])
            return "cachecheck-server"
        if not self.replicas and nodeid in self.fixture_users():
            return "cachecheck-server"
        return None

    # on a worker, before its first request to a server
    def claim(self, server: str, worker: str) -> Optional[str]:
        """Make this worker the only one that sends to ``server`` (a URL), and to any URL that reaches the
        same server, for the rest of the session. Returns None when it is (or now is) the owner, else the id
        of the worker that already owns it."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: the check at session end still holds
            return None
        taken: List[str] = []
        for key in server_identity(server).keys():
            if key in self._claims:
                continue
            name = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
            handle = open(Path(self.folder) / f"server-{name}.lock", "a+", encoding="utf-8")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.seek(0)
                owner = handle.read().strip() or "another worker"
                handle.close()
                for mine in taken:  # leave no half claim behind
                    self._claims.pop(mine).close()
                return owner
            handle.seek(0)
            handle.truncate()
            handle.write(worker)
            handle.flush()
            self._claims[key] = handle  # held until the process ends
            taken.append(key)
        return None

    def close(self) -> None:
        for handle in self._claims.values():
            handle.close()
        self._claims.clear()
        shutil.rmtree(self.folder, ignore_errors=True)


def new_placement(targets: Sequence[Tuple[str, str]], replicas: bool) -> Placement:
    return Placement(tempfile.mkdtemp(prefix="cachecheck-xdist-"), targets, replicas)


def default_unit(nodeid: str, dist: str) -> str:
    """The work unit xdist's own scheduler for ``dist`` would give a test the plugin does not place."""
    if dist == "loadfile":
        return nodeid.split("::", 1)[0]
    if dist == "loadscope":
        return nodeid.rsplit("::", 1)[0]
    if dist == "loadgroup" and nodeid.rfind("@") > nodeid.rfind("]"):
        return nodeid.split("@")[-1]  # xdist_group marks, as xdist names them
    return nodeid  # load, worksteal: every test on its own


def make_scheduler(config: pytest.Config, log: Any, placement: Placement) -> Any:
    """A pytest-xdist scheduler that keeps each server's probes in one worker, in order."""
    try:
        from xdist.scheduler import LoadScopeScheduling
    except ImportError as exc:  # pragma: no cover - every supported xdist has it
        raise pytest.UsageError(f"cachecheck: this pytest-xdist has no LoadScopeScheduling ({exc}); the "
                                f"plugin cannot keep each server's probes in one worker: run without -n") from None
    dist = str(config.getvalue("dist"))

    class CachecheckScheduling(LoadScopeScheduling):  # type: ignore[misc, valid-type]
        def _split_scope(self, nodeid: str) -> str:
            return placement.server_unit(nodeid) or default_unit(nodeid, dist)

    return CachecheckScheduling(config, log)


def check_dist(dist: Optional[str]) -> None:
    """Refuse the one --dist the plugin cannot place probes under: ``each`` runs every test everywhere."""
    if dist in (None, "no") or dist in DIST_MODES:
        return
    raise ConfigError(f"--dist {dist} would send probes to one server from several workers at once, which "
                      f"batches requests and changes answers; use one of {', '.join(DIST_MODES)}")


def own_replica(settings: Settings, worker: Optional[str], numprocesses: Any) -> Settings:
    """With several URLs, each xdist worker owns one server (gwN the N-th); no two workers share one."""
    if len(settings.replicas) < 2:
        return settings
    if worker is not None and worker.startswith("gw") and worker[2:].isdigit():
        from dataclasses import replace

        return replace(settings, url=settings.replicas[int(worker[2:])])
    if isinstance(numprocesses, int) and numprocesses > len(settings.replicas):
        raise ConfigError(f"-n {numprocesses} workers but {len(settings.replicas)} --cachecheck-url servers: "
                          f"each worker needs a server of its own")
    return settings


def worker_id(config: pytest.Config) -> Optional[str]:
    workerinput: Dict[str, Any] = getattr(config, "workerinput", {})
    worker = workerinput.get("workerid")
    return str(worker) if worker else None


class Role(Enum):
    """What this process does in the session, computed once in ``pytest_configure``."""

    ALONE = "alone"  # no xdist workers: it collects, measures and reports
    CONTROLLER = "controller"  # an xdist controller: its workers measure; it reports and runs the gate
    WORKER = "worker"  # an xdist worker: it measures, and its controller reports

    @classmethod
    def of(cls, config: pytest.Config) -> "Role":
        if hasattr(config, "workerinput"):
            return cls.WORKER
        return cls.ALONE if getattr(config.option, "dist", "no") in (None, "no") else cls.CONTROLLER


# -- what the controller hands its workers --------------------------------------------------------------
@dataclass(frozen=True)
class Handoff:
    """What a worker gets from its controller (``pytest_configure_node``), as one value under one key: the
    probes, episodes and the baseline's known divergences as the controller read them (a worker may not be
    able to read the files again: a pipe such as <(cat f) is the controller's and drained, a FIFO would
    block), the server the controller started, and the placement's folder."""

    probes: Tuple[Probe, ...]
    episodes: Tuple[Episode, ...]
    known_different: Dict[str, Dict[str, str]]  # "<probe|episode>@<target>" -> id -> fingerprint
    served_url: Optional[str] = None
    placement: Optional[str] = None

    KEY = "cachecheck"

    @classmethod
    def of(cls, session: CheckSession, placement: Optional[Placement]) -> "Handoff":
        return cls(tuple(session.probes), tuple(session.episodes),
                   {f"{kind}@{t}": session.baseline_different(t, episodes=kind == "episode")
                    for t in session.targets for kind in ("probe", "episode")},
                   session.served.server.url if session.served is not None else None,
                   placement.folder if placement is not None else None)

    def to_json(self) -> Dict[str, Any]:
        return {"probes": [[p.id, [list(m) for m in p.messages], p.followup, p.source,
                            json.loads(p.expect.spec) if p.expect is not None else None] for p in self.probes],
                "episodes": [[e.source, e.to_json()] for e in self.episodes],
                "known_different": [[key, different] for key, different in self.known_different.items()],
                "served_url": self.served_url, "placement": self.placement}

    @classmethod
    def from_config(cls, config: pytest.Config) -> Optional["Handoff"]:
        """A worker's hand-off; None on the controller or without xdist."""
        given = getattr(config, "workerinput", {}).get(cls.KEY)
        if given is None:
            return None
        from .episodes import parse_episode

        episodes = []
        for source, obj in given["episodes"]:
            path, _, line = str(source).rpartition(":")
            episodes.append(parse_episode(obj, path=path, line=int(line) if line.isdigit() else 0,
                                          default_id=obj["id"]))
        from .outcomes import parse_expect

        def expect(source: str, value: Any) -> Any:  # as the controller read it: it cannot fail here
            return None if value is None else parse_expect(value, lambda f, why: ValueError(f"{source}: {why}"),
                                                           episode=False)

        return cls(tuple(Probe(pid, tuple(tuple(m) for m in messages), followup, source, expect(source, value))
                         for pid, messages, followup, source, value in given["probes"]),
                   tuple(episodes), {key: dict(different) for key, different in given["known_different"]},
                   given["served_url"], given["placement"])


def placement_for(role: Role, settings: Settings, handoff: Optional[Handoff]) -> Optional[Placement]:
    """The session's placement: a new one on an xdist controller, the controller's on a worker, none alone."""
    replicas = len(settings.replicas) > 1
    if role is Role.WORKER and handoff is not None and handoff.placement:
        return Placement(handoff.placement, settings.targets, replicas)
    return new_placement(settings.targets, replicas) if role is Role.CONTROLLER else None
