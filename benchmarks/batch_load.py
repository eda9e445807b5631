"""What the batch measurement's background traffic costs, against a running server; prints figures.

    python benchmarks/batch_load.py URL [--probes 12] [--concurrent 3] [--prompt-words 200]
                                        [--background-tokens 256] [--max-tokens 256] [--seed 0] [--lead 0.2]

Runs pytest_cachecheck.batch over the first N built-in probes (turn 1 alone, then turn 2 alone and amid the
background, twice), cache off on every request, and prints per probe: the measured turn-2 request's seconds
alone and under load, the background's seconds (first sent to last answered) and the probe's wall time; then
the requests sent (measured and background), the mean seconds per probe and the batch summary line. Point
it at a server with several slots (llama-server ``-np 4``): with one, the measured request waits for the
background and its seconds under load show the queue.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_cachecheck.batch import STEPS, BatchRecord, BatchRunner, BatchShape, summary_line  # noqa: E402
from pytest_cachecheck.clients import detect_server  # noqa: E402
from pytest_cachecheck.clients.http import Http  # noqa: E402
from pytest_cachecheck.probes import builtin_probes  # noqa: E402


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url")
    ap.add_argument("--probes", type=int, default=12)
    ap.add_argument("--concurrent", type=int, default=3)
    ap.add_argument("--prompt-words", type=int, default=200)
    ap.add_argument("--background-tokens", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=256, help="the measured requests' max_tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lead", type=float, default=0.2, help="seconds between the background and the request")
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args(argv)
    shape = BatchShape(args.concurrent, args.prompt_words, args.background_tokens, args.seed, args.lead)
    client = detect_server(Http(args.url, timeout=args.timeout), None)
    print(f"server {client.kind} {client.info.build or ''} model {client.info.model} "
          f"slots {client.info.details.get('total_slots', '?')}; {shape.label()}")
    runner = BatchRunner(client, shape, max_tokens=args.max_tokens)
    print(f"{'probe':24} {'outcome':13} {'alone s':>8} {'load s':>8} {'backgr s':>9} {'probe s':>8}")
    records: List[BatchRecord] = []
    start = time.monotonic()
    for probe in builtin_probes()[:args.probes]:
        r = runner.run(probe)
        records.append(r)
        alone = sum(r.alone_s) / len(r.alone_s) if r.alone_s else float("nan")
        load = sum(x.measured_s for x in r.loads) / len(r.loads) if r.loads else float("nan")
        background = sum(x.background_s for x in r.loads) / len(r.loads) if r.loads else float("nan")
        print(f"{r.id[:24]:24} {r.outcome.value:13} {alone:8.2f} {load:8.2f} {background:9.2f} "
              f"{r.duration_s:8.2f}")
    wall = time.monotonic() - start
    measured = sum(len(r.requests) for r in records)
    background = sum(x.background for r in records for x in r.loads)
    print(f"requests sent: {measured + background} ({measured} measured, {len(STEPS)} a probe; {background} "
          f"background, {2 * shape.concurrent} a probe)")
    print(f"seconds: {wall:.1f} in all, {wall / max(1, len(records)):.2f} a probe")
    print(summary_line(records, shape))
    return 0


if __name__ == "__main__":
    sys.exit(main())
