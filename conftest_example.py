"""How an existing test suite wires in pytest-cachecheck. Copy this file to your tests folder as
``conftest.py`` (or merge it into yours), and ``examples/test_cachecheck_custom.py`` beside it.

Settings live best in your ini file; the command line still wins over them, and the environment
(``CACHECHECK_URL``, ``CACHECHECK_API_KEY``) comes last::

    # pytest.ini (or [tool.pytest.ini_options] in pyproject.toml)
    [pytest]
    cachecheck_probes = tests/cachecheck/conversations.jsonl
    cachecheck_max_tokens = 192
    cachecheck_report = cachecheck-report.json
    cachecheck_min_valid = 0.9

Paths in the ini file (``cachecheck_probes``, ``cachecheck_report``, ``cachecheck_html``,
``cachecheck_baseline``, ``cachecheck_record``) are relative to the ini file's folder, as pytest's own ini
paths are, so the settings above hold when pytest starts in a subfolder (``cd tests && pytest``); a
path given on the command line is relative to the folder pytest starts in.

Then ``pytest --cachecheck-url http://127.0.0.1:8080`` runs your suite plus one item per conversation
of your probe file and the ``cachecheck::gate`` item, which carries the verdict; ``pytest -m cachecheck``
runs only the probes (and the gate), ``pytest -m "not cachecheck"`` only the suite. Without a URL the
plugin adds nothing and sends nothing.
"""

from __future__ import annotations

from typing import Dict, List

import pytest

SYSTEM_PROMPT = "You are the support assistant of a bicycle shop. Answer in plain, friendly sentences."


@pytest.fixture(scope="session")
def support_conversation() -> List[Dict[str, str]]:
    """The start of a conversation the way your application sends it (system prompt included)."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "My chain keeps slipping when I climb. In four sentences, what could "
                                    "be wrong and what should I check first?"},
    ]


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    """Run the cache probes after the suite's own tests, so a slow server does not hold up the rest."""
    items.sort(key=lambda item: item.get_closest_marker("cachecheck") is not None)
