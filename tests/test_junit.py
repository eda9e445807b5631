"""The records in other reports: JUnit XML's ``cachecheck`` property is the record as JSON (not a Python
repr), with and without pytest-xdist, while pytest-json-report still gets the record as an object."""

from __future__ import annotations

import importlib.util
import json
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Dict, List

import pytest

from pytest_cachecheck.model import ProbeRecord
from pytest_cachecheck.reporter import JsonRecord

pytestmark = pytest.mark.compat
OWN_CHECK = textwrap.dedent("""
    def test_own(cachecheck):
        assert cachecheck.check(turn1="Describe a bicycle chain in three sentences.", turn2="Shorter.").valid
""")


def properties(path: Path) -> Dict[str, List[str]]:
    """Property name -> the values of every test case's properties of that name."""
    out: Dict[str, List[str]] = {}
    for prop in ET.parse(path).getroot().iter("property"):
        out.setdefault(str(prop.get("name")), []).append(str(prop.get("value")))
    return out


def test_json_record_is_a_dict_whose_str_is_json() -> None:
    rec = JsonRecord({"id": "p", "divergence": None, "valid": True, "text": "it's \"quoted\"\n\u00e9"})
    assert isinstance(rec, dict) and rec["id"] == "p"
    assert json.loads(str(rec)) == dict(rec)
    assert "None" not in str(rec) and "null" in str(rec) and "true" in str(rec)
    assert json.loads(json.dumps([{"cachecheck": rec}])) == [{"cachecheck": dict(rec)}]  # still an object


@pytest.mark.parametrize("xdist", [False, True], ids=["no-xdist", "xdist-2"])
def test_junit_property_is_json(pytester: pytest.Pytester, emulator: Any, xdist: bool) -> None:
    if xdist and importlib.util.find_spec("xdist") is None:
        pytest.skip("pytest-xdist is not installed")
    emu = emulator(diverge_on_hit={"bicycle"})
    pytester.makepyfile(test_own=OWN_CHECK)
    args = [f"--cachecheck-url={emu.url}", "--cachecheck-n=3", "-p", "no:cacheprovider", "--junitxml=j.xml",
            "--json-report", "--json-report-file=jr.json"]
    result = pytester.runpytest_subprocess(*args, *(["-n", "2"] if xdist else []))
    result.assert_outcomes(passed=3, failed=2)  # bike-chain diverges; the own check is valid either way
    props = properties(pytester.path / "j.xml")
    records = [json.loads(v) for v in props["cachecheck"]]  # JSON, not a repr: json.loads fails on one
    assert sorted(r["id"] for r in records) == ["bike-chain", "bread-rising", "tea-steeping"]
    for r in records:
        back = ProbeRecord.from_json(r)  # the whole record, readable as one
        assert back.outcome.value == r["outcome"]
        assert (r["divergence"] is None) == (r["id"] != "bike-chain")
    bike = next(r for r in records if r["id"] == "bike-chain")
    assert bike["outcome"] == "different" and bike["divergence"]["char"] >= 0
    checks = [json.loads(v) for v in props["cachecheck_check"]]
    assert len(checks) == 1 and checks[0]["test"].endswith("test_own")
    # pytest-json-report keeps the record as an object
    jr = json.loads((pytester.path / "jr.json").read_text())
    by_id = {t["nodeid"]: t for t in jr["tests"]}
    probe_tests = [t for n, t in by_id.items() if n.startswith("cachecheck::probe")]
    assert len(probe_tests) == 3
    for t in probe_tests:
        value = t["user_properties"][0]["cachecheck"]
        assert isinstance(value, dict) and value["outcome"] in ("same", "different")
