"""What each measurement costs, against a running server; prints figures.

    python benchmarks/deployed_cost.py URL [--probes 4] [--concurrent 3] [--prompt-words 200]
                                           [--background-tokens 256] [--max-tokens 64] [--between 1]

Measures the first N built-in probes once with every kind the plugin has for a server as deployed, one kind
after the other, and prints per kind: the requests sent (measured, and background or other conversations),
the seconds in all and per probe, and the kind's counts. The kinds: the cache probe on a quiet server
(protocol.py), the batch (batch.py), the cache under load (the probe protocol with every turn 2 amid the
background) and order and state (order.py, the whole set twice). Point it at a server with more slots than
``--concurrent`` (llama-server ``-np 4`` for 3): the cache under load keeps the background off slot 0.
Figures on a tiny model on a CPU say what the background costs relative to a quiet probe, not what a
production server takes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_cachecheck.batch import BatchRunner  # noqa: E402
from pytest_cachecheck.model import BatchShape, OrderConditions, Tally  # noqa: E402
from pytest_cachecheck.order import OrderRunner  # noqa: E402
from pytest_cachecheck.probes import builtin_probes  # noqa: E402
from pytest_cachecheck.protocol import Runner  # noqa: E402
from pytest_cachecheck.settings import resolve  # noqa: E402


def _row(name: str, records: Sequence[Any], seconds: float, background: int) -> str:
    t = Tally.of(records)  # type: ignore[arg-type]
    measured = sum(len(r.requests) for r in records)
    n = max(1, len(records))
    return (f"{name:18} {measured:9d} {background:11d} {seconds:9.1f} {seconds / n:9.2f}   valid {t.valid}, "
            f"different {t.different}, inconclusive {t.inconclusive}, errors {t.errors}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url")
    ap.add_argument("--probes", type=int, default=4)
    ap.add_argument("--concurrent", type=int, default=3)
    ap.add_argument("--prompt-words", type=int, default=200)
    ap.add_argument("--background-tokens", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=64, help="the measured requests' max_tokens")
    ap.add_argument("--between", type=int, default=1, help="other conversations before each probe of pass B")
    args = ap.parse_args(argv)
    settings = resolve({"url": [args.url], "max_tokens": str(args.max_tokens), "batch": str(args.concurrent),
                        "batch_prompt_words": str(args.prompt_words),
                        "batch_max_tokens": str(args.background_tokens)}, base_dir=Path("."))
    assert settings is not None
    shape = BatchShape.of(settings)
    assert shape is not None
    runner = Runner(settings)
    setup = runner.prepare()
    client = setup.cache
    probes = builtin_probes()[:args.probes]
    print(f"server {client.kind} {client.info.build or ''} model {client.info.model} slots "
          f"{client.info.details.get('total_slots', '?')}; {len(probes)} probes, answers up to {args.max_tokens} "
          f"tokens; {shape.label()}")
    for warning in setup.warnings:
        print(f"setup warning: {warning}")
    print(f"{'kind':18} {'measured':>9} {'background':>11} {'seconds':>9} {'per probe':>9}")

    def timed(measure: Callable[[], List[Any]]) -> Any:
        start = time.monotonic()
        records = measure()
        return records, time.monotonic() - start

    quiet, s = timed(lambda: [runner.run(p) for p in probes])
    print(_row("cache (quiet)", quiet, s, 0))
    batch_runner = BatchRunner(client, shape, max_tokens=args.max_tokens)
    batches, s = timed(lambda: [batch_runner.run(p) for p in probes])
    print(_row("batch", batches, s, sum(x.background for r in batches for x in r.loads)))
    loaded, s = timed(lambda: [runner.run(p, load=shape) for p in probes])
    print(_row("cache under load", loaded, s, sum(x.background for r in loaded for x in r.loads)))
    order = OrderRunner(client, OrderConditions(between=args.between), max_tokens=args.max_tokens)
    orders, s = timed(lambda: order.run(probes))
    print(_row("order and state", orders, s, args.between * len(orders)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
