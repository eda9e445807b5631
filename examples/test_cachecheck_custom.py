"""A custom check written with the ``cachecheck`` fixture (see conftest_example.py).

``cachecheck.check()`` runs the same six-request measurement as the probe items and returns the result;
it skips when no server is given, and raises when a request fails.
"""

import pytest


def test_support_answer_does_not_depend_on_the_cache(cachecheck, support_conversation):
    result = cachecheck.check(messages=support_conversation,
                              followup="Now say it in one sentence for a customer in a hurry.")
    if not result.valid:
        pytest.skip(result.reason)  # e.g. the hit did not reach the answer: not a verdict either way
    assert result.same, result.message()


def test_short_form(cachecheck):
    result = cachecheck.check(turn1="In three sentences, how do I fix a flat tyre?",
                              turn2="Which of those steps needs a tool?")
    assert result.outcome in ("same", "different", "inconclusive")
    assert result.cache_answer is not None and result.recompute_answer is not None
