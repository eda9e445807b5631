"""The docs and the README say what the code does: the options page is generated from the plugin's own
registration, and the commands the README and the docs show are the ones the release checks run
(tests/support/release.py, run by tests/run.sh, builds the site with ``mkdocs build --strict``)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from pytest_cachecheck.settings import OPTIONS, options_markdown
from tests.support import release

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def hook():
    spec = importlib.util.spec_from_file_location("cachecheck_docs_hook", DOCS / "_hooks" / "options.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_options_page_is_the_generated_table():
    """The page holds no table of its own: MkDocs puts settings.options_markdown() where the marker is."""
    module = hook()
    page = (DOCS / "options.md").read_text()
    assert page.count(module.MARKER) == 1
    assert not [line for line in page.splitlines() if line.startswith("| `--cachecheck")]
    rendered = module.on_page_markdown(page, None, None, None)
    assert module.MARKER not in rendered and options_markdown() in rendered
    for spec in (s for s in OPTIONS if s.public):
        assert f"| `{spec.flag}" in rendered and f"`{spec.ini}`" in rendered


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists():
    config = (ROOT / "mkdocs.yml").read_text()
    nav = re.findall(r"^  - [^:]+: (\S+\.md)$", config, re.M)
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "_hooks" not in p.parts)
    assert sorted(nav) == pages
    assert "docs/_hooks/options.py" in config and "--strict" in config


def test_the_readme_keeps_its_two_commands_and_the_release_checks_run_them():
    readme = (ROOT / "README.md").read_text()
    quickstart = 'pip install "./[demo]" && cd "$(mktemp -d)" && ' + " ".join(release.DEMO_COMMAND)
    assert f"```bash\n{quickstart}\n```" in readme
    assert "```bash\nbash tests/run.sh\n```" in readme
    assert quickstart in (DOCS / "getting-started.md").read_text()
    run_sh = (ROOT / "tests" / "run.sh").read_text()
    assert "python3 -m tests.support.release wheel || status=1" in run_sh
    assert "python3 -m tests.support.release docs || status=1" in run_sh
    # the docs' probe-file example is the file the release check runs against llama-server
    example = f"--cachecheck-probes {Path(release.PROBE_FILE).name}"
    assert example in (DOCS / "getting-started.md").read_text()
    assert (ROOT / release.PROBE_FILE).is_file()


def test_the_reference_moved_out_of_the_readme():
    readme = (ROOT / "README.md").read_text()
    for heading in ("## Options", "## The JSON report", "## How the code is laid out", "## Benchmarks"):
        assert heading not in readme
    for link in re.findall(r"\(https://github\.com/pytest-cachecheck/pytest-cachecheck/blob/main/([^)#]+)", readme):
        assert (ROOT / link).exists(), link


def test_the_release_workflow_publishes_what_it_checked_with_trusted_publishing():
    text = (ROOT / "examples" / "release.yml").read_text()
    for wanted in ("python -m build", "twine check --strict dist/*", "id-token: write",
                   "uses: pypa/gh-action-pypi-publish@release/v1", "name: pypi"):
        assert wanted in text, wanted
    assert "password:" not in text and "secrets." not in text  # no API token: the OIDC identity is the credential
    # the tag check reads the version where pyproject.toml reads it
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'version = { attr = "pytest_cachecheck.__version__" }' in pyproject
    assert "import pytest_cachecheck; print(pytest_cachecheck.__version__)" in text


def _anchors(page: Path) -> set:
    """The heading anchors MkDocs makes for a page: lower case, punctuation dropped, spaces as hyphens."""
    heads = re.findall(r"^#+ +(.+?) *$", page.read_text(encoding="utf-8"), re.M)
    return {re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", h.lower()).strip()) for h in heads}


def test_every_link_to_a_section_finds_its_heading():
    """A link ``page.md#anchor`` (or ``#anchor`` on the same page) in the docs names a heading that exists: a
    renamed section otherwise breaks ``mkdocs build --strict`` only in the release checks, at the end of the
    test command."""
    broken = []
    for page in sorted(DOCS.glob("*.md")):
        for target, anchor in re.findall(r"\]\(([\w./-]*\.md)?#([\w-]+)\)", page.read_text(encoding="utf-8")):
            linked = (page.parent / target) if target else page
            if not linked.exists() or anchor not in _anchors(linked):
                broken.append(f"{page.name}: {target}#{anchor}")
    assert broken == []
