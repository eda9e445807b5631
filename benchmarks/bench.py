"""Benchmarks against real tiny llama-servers; run on demand, they print figures (no pass/fail).

    python benchmarks/bench.py [--probes 8] [--rounds 2] [--ftype q4_0]

1. overhead: wall time of ``pytest --cachecheck-url`` for a probe set against the same six requests per
   probe sent by a bare loop of plain ``requests`` calls, on the same server in the same run (target <= 1.02);
2. scaling: the same probe set on one server vs two servers under ``-n 2`` (target <= 1.1 / 2 = 0.55);
3. start-up: ``pytest --collect-only`` in an empty folder with the plugin on vs off.

    python benchmarks/bench.py --scale [5000 20000]

4. many probes (no server needed): ``pytest --collect-only`` of a generated probe file of N lines, plugin
   on vs off, and the session end of N records (verdict, JSON report, HTML page, terminal summary, with a
   baseline of N); the time per probe should not grow with N.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

import requests

from pytest_cachecheck.llama_server import LlamaServer
from pytest_cachecheck.probes import builtin_probes
from pytest_cachecheck.serve import demo_model, ensure_llama_server


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def bare_protocol(url: str, n: int, max_tokens: int = 256) -> float:
    """The six requests per probe, as plain requests calls: the floor the plugin is measured against."""
    session = requests.Session()
    base = {"temperature": 0, "max_tokens": max_tokens, "stream": False, "samplers": ["temperature"],
            "id_slot": 0}
    start = time.perf_counter()
    for probe in builtin_probes()[:n]:
        def ask(messages: List[Dict[str, str]], cache: bool, logprobs: bool) -> str:
            body = dict(base, messages=messages, cache_prompt=cache)
            if logprobs:
                body.update(logprobs=True, top_logprobs=2)
            r = session.post(url + "/v1/chat/completions", json=body, timeout=300)
            r.raise_for_status()
            return r.json()["choices"][0]["message"]["content"]
        first = None
        for _ in range(2):
            answer = ask(probe.turn1_messages(), False, False)
            first = first if first is not None else answer
            ask(probe.turn2_messages(answer), True, True)
        for _ in range(2):
            ask(probe.turn2_messages(first), False, True)
    return time.perf_counter() - start


def plugin_run(args: List[str]) -> Tuple[float, float]:
    """(wall time of the whole pytest run, sum of the probes' own measured durations)."""
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args,
                        "--cachecheck-report=r.json"], cwd=folder, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        probes = json.loads(Path(folder, "r.json").read_text())["probes"]
        return wall, sum(p["duration_s"] for p in probes)


def collect_only(args: List[str], rounds: int = 7) -> float:
    times = []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(rounds):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                            *args], cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--probes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ftype", default="q4_0")
    parser.add_argument("--scale", type=int, nargs="*", default=None, metavar="N",
                        help="only the many-probes figures, for these probe counts (default 5000 20000)")
    opts = parser.parse_args()
    if opts.scale is not None:
        scale(opts.scale or [5000, 20000])
        return 0
    binary = ensure_llama_server(log)
    model = demo_model(log, opts.ftype)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_implementation()} "
          f"{platform.python_version()}; llama-server {binary}; model tiny {opts.ftype}; {opts.probes} probes")
    cores = os.cpu_count() or 2
    with LlamaServer(binary, model) as one:
        bare_protocol(one.url, 1)  # warm up
        bare, wall, inside = [], [], []
        for _ in range(opts.rounds):  # interleaved, so drift hits both alike
            bare.append(bare_protocol(one.url, opts.probes))
            w, i = plugin_run([f"--cachecheck-url={one.url}", f"--cachecheck-n={opts.probes}"])
            wall.append(w)
            inside.append(i)
        b, w, i = statistics.median(bare), statistics.median(wall), statistics.median(inside)
        print(f"1. overhead: bare protocol {b:.2f} s; plugin: probes {i:.2f} s (ratio {i / b:.3f}, target <= 1.02), "
              f"whole pytest run incl. start-up {w:.2f} s (ratio {w / b:.3f})")
        single = [plugin_run([f"--cachecheck-url={one.url}", f"--cachecheck-n={opts.probes}"])[0]
                  for _ in range(opts.rounds)]
    # replicas share the machine: each gets its share of the cores, as on a real multi-GPU host
    share = ("-t", str(max(1, cores // 2)))
    with LlamaServer(binary, model, extra_args=share) as a, LlamaServer(binary, model, extra_args=share) as b2:
        bare_protocol(a.url, 1)
        bare_protocol(b2.url, 1)
        pair = [plugin_run([f"--cachecheck-url={a.url}", f"--cachecheck-url={b2.url}",
                            f"--cachecheck-n={opts.probes}", "-n", "2"])[0] for _ in range(opts.rounds)]
    s1, s2 = statistics.median(single), statistics.median(pair)
    print(f"2. scaling: one server ({cores} threads) {s1:.2f} s, two servers ({share[1]} thread(s) each) under "
          f"-n 2 {s2:.2f} s, ratio {s2 / s1:.3f} (target <= {1.1 / 2:.3f})")
    off = collect_only(["-p", "no:cachecheck"])
    on_idle = collect_only([])
    on = collect_only(["--cachecheck-url=http://127.0.0.1:9"])
    print(f"3. start-up (--collect-only, empty folder, median of 7): plugin off {off:.3f} s, installed but "
          f"not enabled {on_idle:.3f} s, enabled with 20 probes {on:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
