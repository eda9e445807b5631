"""The validity rules (pytest_cachecheck.validity): one copy, read by probes and episodes alike."""

from __future__ import annotations

from types import SimpleNamespace

from pytest_cachecheck.validity import Rules, differs, inconclusive, untrusted


def counted(prompt=None, answer=None, cached=None):
    return SimpleNamespace(prompt_tokens=prompt, completion_tokens=answer, cached_tokens=cached)


RULES = Rules(tolerance=4, skip_hit_check=False, clean_start=True)
TURN1 = counted(100, 50)  # full reuse 149, need 145


def test_a_hit_must_reach_prompt_and_answer_within_the_tolerance():
    assert RULES.full(TURN1) == 149 and RULES.need(TURN1) == 145
    assert RULES.hit("hit", 145, TURN1, "turn-1", "the turn-1 prompt") is None
    short = RULES.hit("hit", 144, TURN1, "turn-1", "the turn-1 prompt")
    assert short is not None and short.short
    assert short.text == "hit was 144 tokens, expected at least 145 (turn-1 prompt 100 + answer 50 - 1 - tolerance 4)"
    assert RULES.hit("hit", None, TURN1, "turn-1", "the turn-1 prompt").short  # no counter counts as no hit


def test_a_hit_must_reach_past_the_prompt_even_when_the_tolerance_allows_less():
    loose = Rules(tolerance=60, skip_hit_check=False, clean_start=True)  # need 89, below the 100-token prompt
    hit = loose.hit("hit", 100, TURN1, "turn-1", "the turn-1 prompt")
    assert hit is not None and not hit.short
    assert hit.text == "hit was 100 tokens, not past the turn-1 prompt (100 tokens)"
    assert loose.hit("hit", 101, TURN1, "turn-1", "the turn-1 prompt") is None


def test_a_short_hit_stops_inside_the_answer_only_past_the_prompt():
    assert RULES.stops_inside(120, TURN1)
    assert not RULES.stops_inside(95, TURN1) and not RULES.stops_inside(145, TURN1)


def test_skipping_the_hit_check_skips_only_the_hit():
    skip = Rules(tolerance=0, skip_hit_check=True, clean_start=True)
    assert skip.hit("hit", 0, TURN1, "turn-1", "p") is None
    assert skip.clean("cache run 1: turn 1", 16) == ("cache run 1: turn 1 reused 16 cached tokens; it must start "
                                                     "from a clean state")
    assert skip.no_reuse("recompute run 1", 16) == "recompute run 1 reused 16 cached tokens, expected 0"


def test_clean_start_is_checked_only_where_the_mode_can_tell():
    assert Rules(0, False, clean_start=False).clean("x", 16) is None
    assert RULES.clean("x", 0) is None and RULES.clean("x", None) is None
    assert RULES.no_reuse("x", 0) is None and RULES.no_reuse("x", None) is None


def test_impossible_counters_make_the_measurement_untrusted():
    assert untrusted([("a", counted(10, 5, 3))]) is None
    why = untrusted([("a", counted(10, -1, 3)), ("b", counted(10, 5, 11)), ("c", counted(-2, 5, 0))], limit=2)
    assert why == ("inconclusive: the server reported impossible token counts, so its cache counters cannot be "
                   "trusted: a: completion_tokens -1; b: cached_tokens 11 above prompt_tokens 10")


def test_reasons_list_problems_up_to_a_limit():
    assert inconclusive(["a", "b", "c"]) == "inconclusive: a; b; c"
    assert inconclusive(["a", "b", "c"], limit=2) == "inconclusive: a; b; and 1 more"
    assert differs("runs differ", None, "step") is None
    assert differs("runs differ", 3, "step") == "runs differ (from step 3)"
