"""What one pytest session of the plugin holds: the settings, the probes, one runner per target, the
baselines, the server it started. Built once from the raw option values; every bad value raises
ConfigError before any request. Knows nothing about pytest.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, Optional

from .errors import ConfigError, ModelChoiceError, RequestError, ServerSetupError
from .kinds import BATCH, EPISODE, LOADED, ORDER, PROBE, Kind
from .model import ProbeSet, record_key
from .probes import Probe, ProbeFileError, builtin_probes, load_probes, probe_set_fingerprint
from .redact import Redactor
from .settings import Settings, check_outputs, resolve

if TYPE_CHECKING:  # the measurement (and requests) are imported only when the plugin is enabled
    from ._collect import Handoff
    from .baseline import Baseline
    from .episodes import Episode
    from .model import BatchShape, OrderConditions
    from .protocol import Runner
    from .run import TargetInput
    from .serve import Served


class CheckSession:
    """The plugin's state for one pytest session (on the controller and on each xdist worker)."""

    def __init__(self, settings: Settings, probes: List[Probe], probe_set: ProbeSet,
                 baselines: Dict[Optional[str], "Baseline"], served: Optional["Served"] = None,
                 episodes: Optional[List["Episode"]] = None,
                 server_kinds: Callable[[], Iterable[Any]] = tuple) -> None:
        from .protocol import Runner

        self.settings = settings
        self.probes = probes
        self.probe_set = probe_set
        self.episodes: List["Episode"] = episodes or []
        self.episode_set: Optional[ProbeSet] = None
        if settings.episode_files:
            from .episodes import episode_set_fingerprint

            label = "+".join("builtin" if f == "builtin" else Path(f).name for f in settings.episode_files)
            self.episode_set = ProbeSet(name=label, count=len(self.episodes),
                                        fingerprint=episode_set_fingerprint(self.episodes))
        self.baselines = baselines
        self.served = served
        #: "<probe|episode>@<target>" -> baseline_different(...), as a worker's controller found it
        self.known_different: Optional[Dict[str, Dict[str, str]]] = None
        self.redactor = Redactor()
        for _, url in settings.targets:
            self.redactor.add_url(url)
        #: one runner per target of a matrix; one runner, under the name None, otherwise
        self.runners: Dict[Optional[str], Runner] = {}
        for name, url in settings.targets or ((None, settings.url),):
            own = settings if name is None else dataclasses.replace(settings, url=url)
            self.runners[name] = Runner(own, self.redactor, server_kinds)

    @property
    def targets(self) -> List[Optional[str]]:
        return list(self.runners)

    def runner(self, target: Optional[str] = None) -> "Runner":
        return self.runners[target]

    def runs(self, kind: Kind) -> bool:
        """Whether this session has items of ``kind``: the probes always, the episodes when some are
        configured, each as-deployed kind when its option is on. The one place that says which kinds run."""
        s = self.settings
        return {PROBE.name: True, EPISODE.name: bool(self.episodes), BATCH.name: s.batch is not None,
                LOADED.name: s.load_cache, ORDER.name: s.order}[kind.name]

    def cases(self, kind: Kind) -> List[Any]:
        """What the items of ``kind`` measure, in run order: the episodes for episodes, else the probes (the
        as-deployed kinds measure the probes again); none when the kind does not run."""
        return [] if not self.runs(kind) else list(self.episodes) if kind == EPISODE else list(self.probes)

    def item_set(self, kind: Kind) -> Optional[ProbeSet]:
        """The set ``kind``'s items come from: the episode set when episodes are configured, the probe set for
        the probes and each as-deployed kind that runs; else None."""
        if kind == EPISODE:
            return self.episode_set
        return self.probe_set if self.runs(kind) else None

    def kind_keys(self, kind: Kind) -> List[str]:
        """Every record key of ``kind``'s items, in run order (target by target); none when it does not run."""
        return [record_key(c.id, t) for t in self.targets for c in self.cases(kind)]

    def keys(self) -> List[str]:
        """Every probe item's record key, in run order (target by target)."""
        return self.kind_keys(PROBE)

    @property
    def order_conditions(self) -> Optional["OrderConditions"]:
        """How the order kind sends the probe set (--cachecheck-order and its options); None when off."""
        from .model import OrderConditions

        return OrderConditions.of(self.settings)

    @property
    def batch_shape(self) -> Optional["BatchShape"]:
        """The batch kind's background traffic (--cachecheck-batch and its shape options); None when off."""
        from .model import BatchShape

        return BatchShape.of(self.settings)

    def baseline_different(self, target: Optional[str], episodes: bool = False) -> Dict[str, str]:
        """id -> conversation fingerprint of the probes (or episodes) that differed in the target's
        baseline."""
        if self.known_different is not None:
            return self.known_different.get(f"{'episode' if episodes else 'probe'}@{target}", {})
        from .baseline import known_different

        return known_different(self.baselines.get(target), episodes)

    def expectation(self, record: Any) -> Optional[str]:
        """Why this record's divergence does not fail the run by itself, or None (``run.expectation``)."""
        from .model import BatchRecord, EpisodeRecord, LoadedRecord, OrderRecord
        from .run import expectation

        # a baseline's known divergences are probes' and episodes'; a batch, loaded or order probe has none
        known = ({} if isinstance(record, (BatchRecord, LoadedRecord, OrderRecord))
                 else self.baseline_different(record.target, episodes=isinstance(record, EpisodeRecord)))
        return expectation(record, self.settings, known)

    def prepare(self, *, send: bool) -> Dict[Optional[str], Optional[str]]:
        """Resolve (and, with ``send``, check) every target's server setup; target -> error text or None.
        Raises ConfigError when a server does not serve the model asked for (or serves several and none was
        chosen): the option is wrong, whatever the server does."""
        for name, runner in self.runners.items():  # first what each server is, sending nothing that generates
            try:
                runner.prepare(send=False)
            except ModelChoiceError as exc:
                raise ConfigError((f"target {name}: " if name is not None else "") + str(exc)) from None
            except (RequestError, ServerSetupError):
                pass  # the runner keeps it and raises it again below
        errors: Dict[Optional[str], Optional[str]] = {}
        for name, runner in self.runners.items():
            try:
                runner.prepare(send=send)
                errors[name] = None
            except (RequestError, ServerSetupError) as exc:
                errors[name] = str(exc)
        return errors

    def target_inputs(self) -> List["TargetInput"]:
        from .run import TargetInput

        served = self.served.describe() if self.served is not None else None
        return [TargetInput(name, runner.settings.url,
                            runner.setup.describe() if runner.setup is not None else None, served)
                for name, runner in self.runners.items()]


@dataclass(frozen=True)
class Host:
    """What the process hosting the session (pytest, for the plugin) gives it, in one value.

    ``handoff``: on an xdist worker, what its controller read and started (the probes, episodes, the
    baseline's known divergences, the served server), used instead of the files (a worker may not be able to
    read them again: a pipe is the controller's); ``start_server``: how the controller starts
    ``--cachecheck-serve``'s server, once all else is valid (told whether an episode calls tools: the demo
    then serves its tool-call model, and the --cache-ram to start it with), None on a worker;
    ``own_replica``: the replica this process measures
    on; ``other_outputs``: files other plugins write, by option (no output may be another's file);
    ``server_kinds``: calls the ``pytest_cachecheck_server_kinds`` hook (when the servers are detected, so
    that a plugin registered after this session still counts)."""

    handoff: Optional["Handoff"] = None
    start_server: Optional[Callable[[str, Optional[str], bool, int], "Served"]] = None
    own_replica: Callable[[Settings], Settings] = lambda s: s
    other_outputs: Mapping[str, Optional[str]] = dataclasses.field(default_factory=dict)
    server_kinds: Callable[[], Iterable[Any]] = tuple


def open_session(raw: Dict[str, Any], base_dir: Path, host: Host = Host()) -> Optional[CheckSession]:
    """The session for these raw option values (command line over ini over environment), or None when
    no server is given (the plugin stays off). Raises ConfigError."""
    handoff = host.handoff
    probes = list(handoff.probes) if handoff is not None else None
    episodes = list(handoff.episodes) if handoff is not None else None
    settings = resolve(raw, base_dir=base_dir)
    if settings is None:
        return None
    if settings.serve:
        from .serve import check_serve_args

        check_serve_args(settings.serve, settings.server_args)
        if handoff is not None and handoff.served_url:  # a worker: the controller's server
            settings = dataclasses.replace(settings, url=handoff.served_url, replicas=(handoff.served_url,))
    check_outputs(settings, host.other_outputs)
    settings = host.own_replica(settings)
    try:
        if probes is None:
            probes = load_probes(settings.probe_files) if settings.probe_files else builtin_probes()
    except ProbeFileError as exc:
        raise ConfigError(f"--cachecheck-probes: bad probe file: {exc}") from None
    if settings.n is not None:
        probes = probes[: settings.n]
    name = "builtin" if not settings.probe_files else "+".join(Path(p).name for p in settings.probe_files)
    probe_set = ProbeSet(name=name, count=len(probes), fingerprint=probe_set_fingerprint(probes))
    if settings.episode_files and episodes is None:
        from .episodes import load_episodes

        try:
            episodes = load_episodes(settings.episode_files)
        except ProbeFileError as exc:
            raise ConfigError(f"--cachecheck-episodes: bad episode file: {exc}") from None
    baselines = _baselines(settings) if handoff is None else {}
    served = None
    if settings.serve and host.start_server is not None:
        assert settings.serve is not None
        served = host.start_server(settings.serve, settings.server_args, any(e.tools for e in episodes or ()),
                                   settings.serve_cache_ram)
        settings = dataclasses.replace(settings, url=served.server.url, replicas=(served.server.url,))
    session = CheckSession(settings, probes, probe_set, baselines, served, episodes, host.server_kinds)
    session.known_different = handoff.known_different if handoff is not None else None
    return session


def _baselines(settings: Settings) -> Dict[Optional[str], "Baseline"]:
    if not settings.baseline:
        return {}
    from .baseline import BaselineError, baseline_for, load_baseline

    try:
        loaded = load_baseline(settings.baseline)
        names: List[Optional[str]] = [n for n, _ in settings.targets] or [None]
        return {name: baseline_for(loaded, name, settings.baseline) for name in names}
    except BaselineError as exc:
        raise ConfigError(f"--cachecheck-baseline: {exc}") from None

