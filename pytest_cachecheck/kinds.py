"""The kinds of measured item: two-turn probes, episodes, and whatever comes next.

A kind is what the verdict, the gates and the summaries call an item of it; everything that holds items holds
them by kind (``run.KindInput`` / ``run.KindResult``), so a new kind is one :class:`Kind` and its records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Kind:
    name: str  # the item's test function, and the word for one: "probe"
    plural: str
    differed: str  # what a valid item that differed did (after "3 valid probes")
    changed: str  # the same, short (after "2 of 20 valid probes")
    rate_name: str  # what the rate of differing items is called
    word: str = ""  # the word for one item, when it is not ``name``: "batch probe"
    #: what a large-gap difference means for this kind, said after its anatomy ("" says nothing more)
    large_gap: str = ""

    @property
    def unit(self) -> str:
        """The word for one item: "probe", "batch probe"."""
        return self.word or self.name

    @property
    def none_differed(self) -> str:
        return f"no valid {self.unit} {self.changed}"


#: a large gap where the cache was off or the state came from elsewhere is no rounding: at least one side was sure
STATE_BUG = ("a large gap {where} is not rounding noise (at least one side was sure of its token): the signature "
             "of a server bug that mixes state between requests (such bugs exist upstream: llama.cpp #27148 "
             "restored another conversation's cache); report it with this record")

PROBE = Kind("probe", "probes", "gave a different turn-2 answer", "differed", "divergence rate")
EPISODE = Kind("episode", "episodes", "changed trajectory", "changed trajectory", "trajectory change rate")
#: a probe's turn 2 alone and amid other requests, the cache off (batch.py)
BATCH = Kind("batch", "batch probes", "answered differently amid other requests",
             "answered differently amid other requests", "batch divergence rate", word="batch probe",
             large_gap=STATE_BUG.format(where="amid other requests"))
#: the probe protocol (cache path vs recompute path) with every turn-2 request amid the batch kind's background
LOADED = Kind("loaded", "loaded probes", "diverged under load", "diverged under load",
              "divergence rate under load", word="loaded probe",
              large_gap=STATE_BUG.format(where="under load"))
#: the probe set sent as an application would, twice, in another order and with other conversations between
#: (order.py)
ORDER = Kind("order", "order probes", "answered differently in another order and state",
             "answered differently in another order and state", "order divergence rate", word="order probe",
             large_gap=STATE_BUG.format(where="between the two passes"))
KINDS = (PROBE, EPISODE, BATCH, LOADED, ORDER)


def listed(words: Sequence[str], conjunction: str) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} {conjunction} {words[-1]}"


def any_of(kinds: Sequence[Kind]) -> str:
    """``probe``, ``probe or episode``: one item of any of these kinds."""
    return listed([k.unit for k in kinds], "or")


def all_of(kinds: Sequence[Kind]) -> str:
    """``probes``, ``probes and episodes``."""
    return listed([k.plural for k in kinds], "and")
