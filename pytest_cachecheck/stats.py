"""The statistics of a run: the 95% Wilson interval of a rate, the exact McNemar test, p-values for people."""

from __future__ import annotations

import math
from typing import Optional, Tuple

Z95 = 1.959964


def wilson(k: int, n: int, z: float = Z95) -> Optional[Tuple[float, float]]:
    """95% Wilson score interval for k successes of n (None when n is 0)."""
    if n <= 0:
        return None
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value on the discordant pairs ``b`` and ``c``.

    Under the null hypothesis each discordant pair goes either way with probability 1/2, so
    ``p = min(1, 2 * P(X <= min(b, c)))`` with ``X ~ Binomial(b + c, 1/2)``; 1.0 when ``b + c == 0``.
    """
    if b < 0 or c < 0:
        raise ValueError("b and c are counts and cannot be negative")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return min(1.0, (2 * tail) / (2 ** n))  # int / int: exact even for large n


def format_p(p: Optional[float]) -> str:
    """A p-value for people: ``0.0625``, ``1.000``, ``3.2e-05``; ``n/a`` for None."""
    if p is None:
        return "n/a"
    if p >= 0.001:
        return f"{p:.4f}" if p < 0.1 else f"{p:.3f}"
    return f"{p:.1e}"


def pct(x: Optional[float]) -> str:
    """A fraction as a percentage with one decimal, ``n/a`` for None."""
    return "n/a" if x is None else f"{x:.1%}"
