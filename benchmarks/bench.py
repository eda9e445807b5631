"""Benchmarks against real tiny llama-servers; run on demand, they print figures (no pass/fail).

    python benchmarks/bench.py [--ftypes f16,q4_0] [--probes 12] [--max-tokens 128] [--rounds 1]
                               [--before PATH] [--width 128] [--layers 2]

Models: the tiny demo models (width 128, 2 layers), or with ``--width``/``--layers`` the same random-weight
shaping at another size (written once into the cache), so that a forward pass costs what a real model's
does while the server's fixed cost per token (llama-server's logprobs: a softmax over the whole vocabulary
for every token) stays the same. The one-server part first prints that cost: server CPU of a turn-1 answer
without and with top-2 logprobs.

Per model (the tiny demo models, built once and cached):

1. llama.cpp mode, one server: wall time of ``pytest --cachecheck-url`` against the same six requests per
   probe sent by a bare loop of plain ``requests`` calls without logprobs (the floor of the measurement),
   on the same server, interleaved; with ``--no-logprobs-too`` also the plugin with
   ``--cachecheck-no-logprobs``, with ``--before PATH`` the plugin imported from PATH (an older checkout),
   in the same rounds. Target <= 1.05. Servers run ``-t 1 -tb 1`` unless ``--threads`` says otherwise: on
   a shared machine a server whose threads wait for each other at every step is slowed most by others.
2. two-servers mode: the same against a caching server and a ``--no-cache-prompt`` server.
3. replica scaling: one server vs two replicas under ``-n 2``, every server started with ``-t 1 -tb 1`` (two
   servers with default threads on two cores spin against each other). Target <= 0.55.

For each plugin run: requests and generated tokens per valid verdict (from the JSON report; the setup
checks' few one-token requests are not in it). Then start-up: ``pytest --collect-only`` in an empty folder.

    python benchmarks/bench.py --scale [5000 20000]

Many probes (no server needed): ``pytest --collect-only`` of a generated probe file of N lines, plugin on vs
off, and the session end of N records (verdict, JSON report, HTML page, terminal summary, with a baseline of
N); the time per probe should not grow with N.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import requests

from pytest_cachecheck.llama_server import LlamaServer
from pytest_cachecheck.probes import builtin_probes
from pytest_cachecheck.llama_server import cache_dir
from pytest_cachecheck.serve import demo_model, ensure_llama_server, ensure_vocab

ONE_THREAD = ("-t", "1", "-tb", "1")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def server_cpu(servers: Sequence[LlamaServer]) -> float:
    """CPU seconds (user + system) the servers' processes have used so far (Linux /proc)."""
    total = 0.0
    for server in servers:
        fields = Path(f"/proc/{server.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_of(servers: Sequence[LlamaServer], work: Callable[[], Any]) -> Tuple[Any, float, float]:
    """(work's result, server CPU seconds, client CPU seconds: this process's and its finished children's).

    CPU seconds, unlike wall time, barely move when other people's processes share the cores."""
    s0, c0 = server_cpu(servers), time.process_time() + children_cpu()
    result = work()
    return result, server_cpu(servers) - s0, time.process_time() + children_cpu() - c0


def bench_model(ftype: str, width: int, layers: int) -> Path:
    """The demo model's shaping at another size (cached): width and depth set how much a forward pass
    costs, against the fixed cost per token of whatever the server does outside it (logprobs)."""
    if (width, layers) == (128, 2):
        return demo_model(log, ftype)
    path = cache_dir() / "models" / f"bench-{ftype}-w{width}-l{layers}.gguf"
    if not path.is_file():
        from pytest_cachecheck.tinymodel import TinyModelConfig, write_tiny_model
        config = TinyModelConfig(n_layer=layers, n_embd=width, n_head=max(width // 32, 1),
                                 n_head_kv=max(width // 64, 1), n_ff=2 * width)
        log(f"writing {path}")
        write_tiny_model(path, ftype, vocab_gguf=ensure_vocab(log), config=config)
    return path


def logprob_cost(server: LlamaServer, max_tokens: int, rounds: int = 4) -> str:
    """Server CPU of one turn-1 request without and with top-2 logprobs (every token generated: no end)."""
    session = requests.Session()
    body = {"messages": builtin_probes()[0].turn1_messages(), "temperature": 0,
            "max_tokens": max_tokens, "samplers": ["temperature"], "cache_prompt": False, "ignore_eos": True}
    per: Dict[str, float] = {}
    tokens = 0
    for name, extra in (("plain", {}), ("logprobs", {"logprobs": True, "top_logprobs": 2})):
        def work() -> int:
            n = 0
            for _ in range(rounds):
                r = session.post(server.url + "/v1/chat/completions", json=dict(body, **extra), timeout=600)
                r.raise_for_status()
                n = r.json()["usage"]["completion_tokens"]
            return n
        tokens, cpu, _ = cpu_of([server], work)
        per[name] = cpu / rounds
    extra_ms = (per["logprobs"] - per["plain"]) / max(tokens, 1) * 1000
    return (f"server CPU of a {tokens}-token answer: {per['plain']:.3f} s plain, {per['logprobs']:.3f} s with "
            f"top-2 logprobs ({per['logprobs'] / per['plain']:.2f}x): {per['plain'] / max(tokens, 1) * 1000:.2f} "
            f"ms a token for the model, {extra_ms:.2f} ms a token for the logprobs")


def bare_protocol(url: str, n: int, max_tokens: int, nocache_url: Optional[str] = None) -> float:
    """The six requests per probe in the plugin's order, as plain requests calls, without logprobs."""
    session = requests.Session()
    base = {"temperature": 0, "max_tokens": max_tokens, "stream": False, "samplers": ["temperature"],
            "id_slot": 0}

    def ask(target: str, messages: List[Dict[str, str]], fields: Dict[str, Any]) -> str:
        body: Dict[str, Any] = dict(base, messages=messages, **fields)
        r = session.post(target + "/v1/chat/completions", json=body, timeout=600)
        r.raise_for_status()
        content: str = r.json()["choices"][0]["message"]["content"]
        return content

    # two servers: turn 2 follows the caching server's own setting, recompute goes as it is to the other
    reuse: Dict[str, Any] = {} if nocache_url else {"cache_prompt": True}
    scratch: Dict[str, Any] = {} if nocache_url else {"cache_prompt": False}
    start = time.perf_counter()
    for probe in builtin_probes()[:n]:
        first: Optional[str] = None
        for _ in range(2):
            answer = ask(url, probe.turn1_messages(), {"cache_prompt": False})
            first = first if first is not None else answer
            ask(url, probe.turn2_messages(answer), reuse)
            ask(nocache_url or url, probe.turn2_messages(first), scratch)
    return time.perf_counter() - start


@dataclass
class PluginRun:
    wall: float  # the whole pytest run, pytest's own start-up included
    inside: float  # the sum of the probes' own measured durations
    probes: int
    valid: int
    requests: int
    tokens: int
    parted: int  # probes whose run-1 cache and recompute answers parted (run 2 asks for logprobs)

    def per_valid(self) -> str:
        if not self.valid:
            return "no valid verdict"
        return (f"{self.requests / self.valid:.2f} requests and {self.tokens / self.valid:.0f} generated "
                f"tokens per valid verdict ({self.valid} valid of {self.probes}; "
                f"{self.parted} parted in run 1)")


def plugin_run(args: List[str], pythonpath: Optional[str] = None) -> PluginRun:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args,
                        "--cachecheck-report=r.json"], cwd=folder, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        probes = json.loads(Path(folder, "r.json").read_text())["probes"]
    parted = 0
    for p in probes:
        steps = {r["step"]: r["content"] for r in p["requests"]}
        parted += "recompute-1/turn-2" in steps and steps["cache-1/turn-2"] != steps["recompute-1/turn-2"]
    return PluginRun(wall, sum(p["duration_s"] for p in probes), len(probes),
                     sum(p["outcome"] in ("same", "different") for p in probes),
                     sum(len(p["requests"]) for p in probes),
                     sum(r["completion_tokens"] or 0 for p in probes for r in p["requests"]), parted)


def collect_only(args: List[str], rounds: int = 7) -> float:
    times = []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(rounds):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                            *args], cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def overhead(label: str, opts: argparse.Namespace, servers: Sequence[LlamaServer]) -> None:
    """Interleaved rounds of the bare loop and the plugin variants on the same server(s): wall time, CPU."""
    url, nocache_url = servers[0].url, (servers[1].url if len(servers) > 1 else None)
    common = [f"--cachecheck-url={url}", f"--cachecheck-n={opts.probes}",
              f"--cachecheck-max-tokens={opts.max_tokens}"]
    if nocache_url:
        common.append(f"--cachecheck-nocache-url={nocache_url}")
    variants: Dict[str, Any] = {"plugin": lambda: plugin_run(common)}
    if opts.no_logprobs_too:
        variants["plugin --cachecheck-no-logprobs"] = \
            lambda: plugin_run(common + ["--cachecheck-no-logprobs"])
    if opts.before and not nocache_url:
        variants[f"plugin before ({opts.before})"] = lambda: plugin_run(common, opts.before)
    bare_protocol(url, 1, opts.max_tokens, nocache_url)  # warm up
    for r in range(opts.rounds):  # interleaved, so drift hits all alike
        bare, bare_server, bare_client = cpu_of(
            servers, lambda: bare_protocol(url, opts.probes, opts.max_tokens, nocache_url))
        print(f"  {label}, round {r + 1}: bare loop {bare:.2f} s; CPU server {bare_server:.2f} s + client "
              f"{bare_client:.2f} s", flush=True)
        for name, measure in variants.items():
            run, server, client = cpu_of(servers, measure)
            ratio = (server + client) / (bare_server + bare_client)
            print(f"    {name}: whole pytest run {run.wall:.2f} s (ratio {run.wall / bare:.3f}), probes "
                  f"alone {run.inside:.2f} s (ratio {run.inside / bare:.3f}); CPU server {server:.2f} s "
                  f"(ratio {server / bare_server:.3f}) + client {client:.2f} s, together ratio {ratio:.3f}; "
                  f"{run.per_valid()}", flush=True)


def scaling(opts: argparse.Namespace, binary: Path, model: Path) -> None:
    common = [f"--cachecheck-n={opts.probes}", f"--cachecheck-max-tokens={opts.max_tokens}"]
    with LlamaServer(binary, model, extra_args=ONE_THREAD) as one:
        bare_protocol(one.url, 1, opts.max_tokens)
        single = [plugin_run([f"--cachecheck-url={one.url}", *common]) for _ in range(opts.rounds)]
    with LlamaServer(binary, model, extra_args=ONE_THREAD) as a, \
            LlamaServer(binary, model, extra_args=ONE_THREAD) as b:
        bare_protocol(a.url, 1, opts.max_tokens)
        bare_protocol(b.url, 1, opts.max_tokens)
        pair = [plugin_run([f"--cachecheck-url={a.url}", f"--cachecheck-url={b.url}", *common, "-n", "2"])
                for _ in range(opts.rounds)]
    for r, (s, p) in enumerate(zip(single, pair)):
        print(f"  replica scaling, round {r + 1} (every server -t 1 -tb 1): one server {s.wall:.2f} s, two "
              f"replicas under -n 2 {p.wall:.2f} s, ratio {p.wall / s.wall:.3f} (target <= 0.55); "
              f"two replicas: {p.per_valid()}", flush=True)


def run_end(n: int, folder: str) -> Dict[str, float]:
    """Seconds of each step of the session end for n records (a quarter each same, different,
    inconclusive, error) against a baseline of n records, half of them the same probes."""
    import copy

    from pytest_cachecheck import terminal
    from pytest_cachecheck.baseline import Baseline
    from pytest_cachecheck.files import write_report
    from pytest_cachecheck.htmlreport import write_html
    from pytest_cachecheck.model import Outcome, ProbeRecord, ProbeSet, Request, ServerDescription, Setup
    from pytest_cachecheck.run import TargetInput, summarise
    from pytest_cachecheck.settings import Settings

    template = ProbeRecord("t", "bench:1", "sha256:t", Outcome.SAME, requests=[
        Request(step, "cache", "an answer of some length " * 8, "stop", 40, 60, 0)
        for step in ("cache-1/turn-1", "cache-1/turn-2", "cache-2/turn-1", "cache-2/turn-2",
                     "recompute-1/turn-2", "recompute-2/turn-2")])
    outcomes = (Outcome.SAME, Outcome.DIFFERENT, Outcome.INCONCLUSIVE, Outcome.ERROR)

    def records(count: int, prefix: str) -> List[ProbeRecord]:
        out = []
        for i in range(count):
            r = copy.copy(template)
            r.id, r.fingerprint, r.outcome = f"{prefix}{i}", f"sha256:{prefix}{i}", outcomes[i % 4]
            out.append(r)
        return out

    url = "http://127.0.0.1:8000"
    settings = Settings(url=url, replicas=(url,), baseline="base.json")
    setup = Setup("one-server", ServerDescription("vllm", "0.34.0", "m", {}))
    recs = records(n, "p")
    base = Baseline(recs[: n // 2] + records(n // 2, "q"), {}, None)
    times: Dict[str, float] = {}
    start = time.perf_counter()
    result = summarise(settings, ProbeSet("bench", n, "sha256:" + "ab" * 32), [r.id for r in recs],
                       [TargetInput(None, url, setup)], {r.key: r for r in recs}, [], [r.key for r in recs],
                       {None: base}, False)
    report = result.report(1)
    times["verdict"] = time.perf_counter() - start
    start = time.perf_counter()
    write_report(os.path.join(folder, "r.json"), report, lambda text: text)
    times["json"] = time.perf_counter() - start
    start = time.perf_counter()
    write_html(os.path.join(folder, "r.html"), report, lambda text: text)
    times["html"] = time.perf_counter() - start
    start = time.perf_counter()
    terminal.summary(report, result.verdict, "base.json", False)
    times["terminal"] = time.perf_counter() - start
    return times


def scale(sizes: List[int]) -> None:
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, "
          f"{platform.python_implementation()} {platform.python_version()}")
    with tempfile.TemporaryDirectory() as folder:
        quiet = ["-p", "no:hypothesispytest", "-p", "no:benchmark"]  # plugins slow to load, beside the point
        off = collect_only(["-p", "no:cachecheck", *quiet], rounds=3)
        for n in sizes:
            probes = Path(folder, f"p{n}.jsonl")
            lines = (json.dumps({"id": f"p{i}", "turn1": f"Question {i}?", "turn2": "And?"})
                     for i in range(n))
            probes.write_text("\n".join(lines) + "\n")
            on = collect_only(["--cachecheck-url=http://127.0.0.1:9", f"--cachecheck-probes={probes}",
                               *quiet], rounds=3)
            print(f"4. --collect-only of {n} probes: {on:.2f} s (plugin off, no probes: {off:.2f} s; "
                  f"{(on - off) / n * 1000:.3f} ms per probe)")
        for n in sizes:
            times = run_end(n, folder)
            total = sum(times.values())
            print(f"4. session end of {n} records: {total:.2f} s ({total / n * 1000:.3f} ms per record; "
                  + ", ".join(f"{k} {v:.2f} s" for k, v in times.items()) + ")")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ftypes", default="f16,q4_0")
    parser.add_argument("--probes", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--width", type=int, default=128,
                        help="embedding width of the model (128: the demo model; wider costs more a token)")
    parser.add_argument("--layers", type=int, default=2, help="layers of the model (2: the demo model)")
    parser.add_argument("--before", help="also run the plugin imported from this folder (an older checkout)")
    parser.add_argument("--threads", default="1",
                        help="llama-server -t and -tb of the overhead runs ('default': the server's own)")
    parser.add_argument("--no-logprobs-too", action="store_true",
                        help="also run the plugin with --cachecheck-no-logprobs")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: one,two,scaling,startup")
    parser.add_argument("--scale", type=int, nargs="*", default=None, metavar="N",
                        help="only the many-probes figures, for these probe counts (default 5000 20000)")
    opts = parser.parse_args()
    if opts.scale is not None:
        scale(opts.scale or [5000, 20000])
        return 0
    skip = set(filter(None, opts.skip.split(",")))
    threads = () if opts.threads == "default" else ("-t", opts.threads, "-tb", opts.threads)
    binary = ensure_llama_server(log)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at "
          f"start, {platform.python_implementation()} {platform.python_version()}; llama-server {binary}; "
          f"{opts.probes} probes, max_tokens {opts.max_tokens}, {opts.rounds} round(s); overhead servers "
          f"{' '.join(threads) or 'with default threads'}", flush=True)
    for ftype in opts.ftypes.split(","):
        model = bench_model(ftype, opts.width, opts.layers)
        print(f"model {model.name} ({ftype}, width {opts.width}, {opts.layers} layers):", flush=True)
        if "one" not in skip:
            with LlamaServer(binary, model, extra_args=threads) as one:
                print(f"  {logprob_cost(one, opts.max_tokens)}", flush=True)
                overhead("llama.cpp mode, one server", opts, [one])
        if "two" not in skip:
            with LlamaServer(binary, model, extra_args=threads) as cache, \
                    LlamaServer(binary, model, extra_args=(*threads, "--no-cache-prompt")) as nocache:
                bare_protocol(nocache.url, 1, opts.max_tokens)
                overhead("two-servers mode", opts, [cache, nocache])
        if "scaling" not in skip:
            scaling(opts, binary, model)
    if "startup" not in skip:
        off = collect_only(["-p", "no:cachecheck"])
        on_idle = collect_only([])
        on = collect_only(["--cachecheck-url=http://127.0.0.1:9"])
        print(f"start-up (--collect-only, empty folder, median of 7): plugin off {off:.3f} s, installed but "
              f"not enabled {on_idle:.3f} s, enabled with 20 probes {on:.3f} s")
    print(f"load average {os.getloadavg()[0]:.1f} at the end", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
