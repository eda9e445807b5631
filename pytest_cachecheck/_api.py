"""What the items and the ``cachecheck`` fixture share: the session state on ``config.stash``, the
measurement of one probe or episode (under pytest-xdist only once this worker owns its servers), and the
object test authors get from the fixture."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Union

import pytest

from . import _collect
from .episodes import Episode
from .errors import JudgeError, RequestError
from .interrupts import Interrupts
from .kinds import BATCH, EPISODE, LOADED, ORDER, PROBE, Kind
from .model import BatchRecord, EpisodeRecord, LoadedRecord, OrderRecord, Outcome, ProbeRecord, record_key
from .probes import Probe, parse_probe
from .redact import display_url
from .session import CheckSession
from .settings import Settings

if TYPE_CHECKING:
    from .protocol import Runner

RECORD = "cachecheck"  # user_properties key of a probe record
CHECK_RECORD = "cachecheck_check"  # user_properties key of a cachecheck.check() record
EPISODE_RECORD = "cachecheck_episode"  # user_properties key of an episode record
EPISODE_CHECK_RECORD = "cachecheck_episode_check"  # of a cachecheck.episode() record
BATCH_RECORD = "cachecheck_batch"  # user_properties key of a batch record
LOADED_RECORD = "cachecheck_loaded"  # user_properties key of a loaded record (the cache under load)
ORDER_RECORD = "cachecheck_order"  # user_properties key of an order record
#: kind name -> (the user_properties key of its items' records, the record class)
ITEM_RECORDS = {PROBE.name: (RECORD, ProbeRecord), EPISODE.name: (EPISODE_RECORD, EpisodeRecord),
                BATCH.name: (BATCH_RECORD, BatchRecord), LOADED.name: (LOADED_RECORD, LoadedRecord),
                ORDER.name: (ORDER_RECORD, OrderRecord)}
#: every user_properties key of a record -> (its kind name, whether it is a test's own measurement, the class)
PROPERTIES: Dict[str, Tuple[str, bool, Any]] = {
    **{key: (name, False, cls) for name, (key, cls) in ITEM_RECORDS.items()},
    CHECK_RECORD: (PROBE.name, True, ProbeRecord), EPISODE_CHECK_RECORD: (EPISODE.name, True, EpisodeRecord)}
FLIP = "cachecheck_flip"  # user_properties key (a JUnit property) of an item whose outcome checks flipped


class State:
    """The session, this process's role, the placement of its tests under pytest-xdist, and its signals."""

    def __init__(self, session: CheckSession, role: _collect.Role, placement: Optional[_collect.Placement]) -> None:
        self.session = session
        self.role = role
        self.placement = placement
        # the process that writes the report (not a worker) holds later signals until it is written
        self.interrupts = Interrupts(hold_after_first=role is not _collect.Role.WORKER)
        #: target -> why its server setup is not usable (None: it is), once pytest_sessionstart resolved it
        self.setup_errors: Dict[Optional[str], Optional[str]] = {}
        #: record key -> the record of each probe and episode item this process measured: an item run again
        #: (pytest-rerunfailures) reports its first measurement, so a divergence cannot vanish on a rerun
        self.measured: Dict[Any, Any] = {}  # (kind name, record key) -> record
        #: target -> the probes its order items measure as one set (the selected ones), and id -> the record
        #: each got from the set's one run (finished by its own item, as any other record)
        self.order_sets: Dict[Optional[str], List[Probe]] = {}
        self.orders: Dict[Optional[str], Dict[str, OrderRecord]] = {}

    @property
    def controller_of_workers(self) -> bool:
        """An xdist controller: its workers probe, so it sends no request that generates."""
        return self.role is _collect.Role.CONTROLLER


STATE = pytest.StashKey[Optional[State]]()


def measure(config: pytest.Config, state: State, runner: Runner, case: Union[Probe, Episode],
            target: Optional[str], kind: Optional[Kind] = None) -> Any:
    """Measure one probe (or episode; ``kind`` BATCH: the probe's batch measurement); under pytest-xdist
    only once this worker owns its servers. The record names the server that measured it and the process,
    and holds no known secret (scrubbed here, once, so every output made from it is clean: the plugin's
    reports, JUnit XML, pytest-json-report). An exception the measurement did not expect (a server's answer
    no parser foresaw) is kept as an error record."""
    worker = _collect.worker_id(config)
    kind = kind or (PROBE if isinstance(case, Probe) else EPISODE)
    cls = ITEM_RECORDS[kind.name][1]
    record: Any = None
    if worker is not None and state.placement is not None:
        for url in (runner.settings.url, runner.settings.nocache_url):
            owner = state.placement.claim(url, worker) if url else None
            if owner is not None and url is not None:
                record = cls(id=case.id, source=case.source, fingerprint=case.fingerprint,
                             outcome=Outcome.ERROR, reason=(
                    f"not measured: xdist worker {owner} already sends to {display_url(url)} in this session, "
                    f"and requests sent to one server in parallel change answers; the plugin's placement of "
                    f"this test failed (another plugin's scheduler?)"))
                break
    if record is None:
        try:
            if kind == BATCH:
                record = _batch(runner, case, state)
            elif kind == ORDER:
                record = _order(runner, case, target, state)
            elif kind == LOADED:
                assert isinstance(case, Probe) and state.session.batch_shape is not None
                record = runner.run(case, load=state.session.batch_shape)
            elif isinstance(case, Probe):
                record = runner.run(case)
            else:
                from .trajectory import measure_episode

                record = measure_episode(runner, case)
        except Exception as exc:  # noqa: BLE001 - a record, not a lost measurement
            record = cls(id=case.id, source=case.source, fingerprint=case.fingerprint, outcome=Outcome.ERROR,
                         reason=(
                f"the measurement failed on an unexpected {type(exc).__name__}: {str(exc)[:500]} (the server's "
                f"answer was not what the plugin can read; please report it)"))
    if kind in (BATCH, LOADED) and state.session.batch_shape is not None:
        record.shape = state.session.batch_shape  # an error record made here names the conditions too
    if kind == ORDER and state.session.order_conditions is not None:
        record.conditions = state.session.order_conditions
    if kind == LOADED:
        record.load_alone = _load_alone(state, record_key(case.id, target))
    if case.expect is not None and kind not in (BATCH, LOADED, ORDER):  # their answers are not judged
        record.check_results = case.expect.judge(record)  # on the answers as given, before any scrubbing
    record.target = target
    record.server_url = display_url(runner.settings.url)
    record.worker = worker
    record.run = runner.setup.describe() if runner.setup is not None else None
    return cls.from_json(state.session.redactor.scrub_data(record.to_json()))


def _batch(runner: Runner, probe: Probe, state: State) -> BatchRecord:
    """A probe's batch measurement on ``runner``'s server, once its setup is known (a setup error is the
    record's error, as for a probe)."""
    from .batch import BatchRunner
    from .validity import settled

    shape = state.session.batch_shape
    assert shape is not None
    record = BatchRecord(id=probe.id, source=probe.source, fingerprint=probe.fingerprint, outcome=Outcome.ERROR,
                         shape=shape)
    with settled(record, runner.redactor.scrub):
        s, setup = runner.settings, runner.prepare()
        return BatchRunner(setup.cache, shape, max_tokens=s.max_tokens, logprobs=s.logprobs,
                           skip_hit_check=s.skip_hit_check, redactor=runner.redactor).run(probe)
    return record


def _order(runner: Runner, probe: Probe, target: Optional[str], state: State) -> OrderRecord:
    """A probe's record from the order kind's one run of its target's set (``state.order_sets``: the
    selected order items' probes), made by the first of them to ask; a setup error is every record's."""
    from .order import OrderRunner
    from .validity import settled

    conditions = state.session.order_conditions
    assert conditions is not None
    done = state.orders.setdefault(target, {})
    if probe.id not in done:  # the first order item of this target (or one the set did not hold)
        probes = [p for p in state.order_sets.get(target, []) if p.id not in done] or [probe]
        if probe.id not in {p.id for p in probes}:
            probes.append(probe)
        failed = OrderRecord(id="", source="", fingerprint="", outcome=Outcome.ERROR, conditions=conditions)
        with settled(failed, runner.redactor.scrub):
            s, setup = runner.settings, runner.prepare()
            order = OrderRunner(setup.cache, conditions, max_tokens=s.max_tokens, logprobs=s.logprobs,
                                skip_hit_check=s.skip_hit_check, redactor=runner.redactor)
            done.update({r.id: r for r in order.run(probes)})
        for p in probes:
            done.setdefault(p.id, OrderRecord(id=p.id, source=p.source, fingerprint=p.fingerprint,
                                              reason=failed.reason, outcome=Outcome.ERROR, conditions=conditions))
    return done[probe.id]


def _load_alone(state: State, key: str) -> str:
    """What the batch kind said of this probe in this process (it runs first, on the same server and worker):
    its answer amid the same load with the cache off was ``same`` or ``different``; ``not measured`` when it
    did not run here or was not valid."""
    batch = state.measured.get((BATCH.name, key))
    if batch is None or batch.outcome not in (Outcome.SAME, Outcome.DIFFERENT):
        return "not measured"
    return batch.outcome.value


def measure_item(request: pytest.FixtureRequest, case: Union[Probe, Episode], target: Optional[str],
                 kind: Optional[Kind] = None) -> Any:
    """The record of a probe, episode or batch item (``kind``; default by the case): measured once per
    session (a rerun of the item reports the first measurement), its expectation decided once
    (``run.expectation``), and put on the item for the controller's reporter; a failed request errors the
    item (in setup), a batch item's naming the conditions."""
    state = request.config.stash[STATE]
    assert state is not None
    kind = kind or (PROBE if isinstance(case, Probe) else EPISODE)
    key = record_key(case.id, target)
    record = state.measured.get((kind.name, key))
    if record is None:
        if kind == ORDER and target not in state.order_sets:  # the set: the order items this session runs
            state.order_sets[target] = [
                item.callspec.params[_collect.PARAMS[ORDER.name]] for item in request.session.items
                if _collect.item_key(item) is not None and _collect.item_key(item)[0] == ORDER.name
                and _collect.item_target(item) == target]
        record = measure(request.config, state, state.session.runner(target), case, target, kind)
        record.expected = state.session.expectation(record)
        state.measured[(kind.name, key)] = record
    request.node.user_properties.append((ITEM_RECORDS[kind.name][0], record.to_json()))
    if getattr(record, "check_results", None) is not None and record.flip:
        request.node.user_properties.append((FLIP, f"{record.flip}: {record.check_results.flip_text()}"))
    if record.outcome == Outcome.ERROR:
        why = record.message() if kind in (BATCH, LOADED, ORDER) else record.reason  # those name their conditions
        pytest.fail(f"cachecheck: {why}", pytrace=False)
    return record


def _judged(case: Any, judge: Optional[Callable[[str], Any]]) -> Any:
    """The probe or episode with a test's judge added to its checks."""
    if judge is None:
        return case
    if not callable(judge):
        raise ValueError(f"judge must be a callable on the answer, got {type(judge).__name__}")
    from .outcomes import Expect, Judge

    return dataclasses.replace(case, expect=(case.expect or Expect(())).plus(Judge(judge)))


class CacheCheck:
    """What the ``cachecheck`` fixture gives a test: run your own probe and assert on the result."""

    def __init__(self, state: State, node: pytest.Item) -> None:
        self._state = state
        self._node = node

    @property
    def settings(self) -> Settings:
        return self._state.session.settings

    @property
    def targets(self) -> List[str]:
        """The names of the target matrix (empty without one)."""
        return [n for n, _ in self.settings.targets]

    def check(self, turn1: Optional[str] = None, turn2: Optional[str] = None, *,
              messages: Optional[List[Dict[str, str]]] = None, followup: Optional[str] = None,
              id: Optional[str] = None, target: Optional[str] = None, expect: Any = None,
              judge: Optional[Callable[[str], Any]] = None) -> ProbeRecord:
        """Measure one conversation; returns its record (.same, .different, .valid, .reason, answers).

        ``target`` names the server of a target matrix to measure on (default: the first). ``expect``
        (the checks of a probe file's ``expect`` field) and ``judge`` (a callable on the turn-2 answer that
        returns a truth value or raises AssertionError) are the outcome checks, run on each path's answer:
        ``.check_results``, ``.flip`` (``cache-fails``, ``cache-passes`` or None) and ``.message()``, which
        starts with the flip.
        Raises ValueError for a malformed conversation, check or target, RequestError when a request
        fails, and JudgeError when the judge raises anything but AssertionError (after the record is kept).
        """
        __tracebackhide__ = True  # its locals (the runner, the state) lead to the settings and URLs
        target = self._target(target, "check")
        obj: Dict[str, Any] = {}
        if messages is not None or followup is not None:
            obj.update({"messages": messages, "followup": followup})
        if turn1 is not None or turn2 is not None:
            obj.update({"turn1": turn1, "turn2": turn2})
        if id is not None:
            obj["id"] = id
        if expect is not None:
            obj["expect"] = expect
        probe = parse_probe(obj, path=f"cachecheck.check() in {self._node.nodeid}", line=1,
                            default_id=self._node.name)
        return self._measure(_judged(probe, judge), target, CHECK_RECORD)

    def episode(self, messages: List[Dict[str, str]], user_turns: Optional[List[str]] = None, *,
                tools: Optional[List[Dict[str, Any]]] = None, tool_results: Optional[Dict[str, Any]] = None,
                tool_choice: Any = None, max_steps: Optional[int] = None, id: Optional[str] = None,
                target: Optional[str] = None, expect: Any = None,
                judge: Optional[Callable[[str], Any]] = None) -> EpisodeRecord:
        """Measure one episode (the fields of an episode file); returns its record (.same, .changed,
        .valid, .reason, .parting, .paths, and with ``expect`` or ``judge``, a callable on the final
        answer, the outcome checks as for :meth:`check`). Raises ValueError for a malformed episode or an
        unknown target, RequestError when a request fails, and JudgeError as :meth:`check`."""
        __tracebackhide__ = True
        from .episodes import parse_episode

        target = self._target(target, "episode")
        obj: Dict[str, Any] = {"messages": messages, "user_turns": user_turns or []}
        obj.update({k: v for k, v in (("tools", tools), ("tool_results", tool_results), ("tool_choice", tool_choice),
                                      ("max_steps", max_steps), ("id", id), ("expect", expect)) if v is not None})
        case = parse_episode(obj, path=f"cachecheck.episode() in {self._node.nodeid}", line=1,
                             default_id=self._node.name)
        return self._measure(_judged(case, judge), target, EPISODE_CHECK_RECORD)

    def _measure(self, case: Union[Probe, Episode], target: Optional[str], key: str) -> Any:
        __tracebackhide__ = True
        record = measure(self._node.config, self._state, self._state.session.runner(target), case, target)
        record.test = self._node.nodeid
        self._node.user_properties.append((key, record.to_json()))
        if record.outcome == Outcome.ERROR:
            raise RequestError(record.reason)
        if record.check_results is not None and record.check_results.error is not None:
            raise JudgeError(f"cachecheck: the check could not be evaluated: {record.check_results.error}")
        return record

    def _target(self, target: Optional[str], method: str) -> Optional[str]:
        names = self._state.session.targets
        if target is None:
            return names[0]
        if target not in names:
            raise ValueError(f"cachecheck.{method}(target={target!r}): the targets are "
                             + (", ".join(str(n) for n in names) if names != [None] else
                                "none (no --cachecheck-target was given)"))
        return target
