"""The release checks: what a user installs and reads, built and run as a user gets it.

``python3 -m tests.support.release wheel`` (``tests/run.sh`` runs it): build the sdist and the wheel with
``python -m build`` (the wheel from the sdist, so a file the sdist lacks is missing from the wheel too),
``twine check --strict`` both, check that they hold the license and every package file git tracks, install
the wheel with its ``demo`` extra into a fresh venv under a temp dir, and there run, outside this checkout,
``pytest --version`` (the plugin and its version listed), the README's demo (``pytest --cachecheck-serve
demo``, which must end red for the expected reason) and a short run of the docs' probe-file example against
a real llama-server.

``python3 -m tests.support.release docs``: build the docs site (``mkdocs build --strict``: a warning such as
a broken link fails) into a temp dir.

The tools (build, twine, mkdocs) live in one cached venv under the project cache, keyed by their pins; the
venv the wheel goes into is made afresh on every run. Prints one line per step with its time; any failure
ends with exit status 1 and what failed.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from pytest_cachecheck import __version__
from pytest_cachecheck.llama_server import LlamaServer, cache_dir

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("build==1.6.1", "twine==7.0.0", "mkdocs==1.6.1", "pytest", "requests")  # pytest: the docs hook
#: the README's quickstart command after the install, run as written in a fresh folder
DEMO_COMMAND = ("pytest", "--cachecheck-serve", "demo")
#: the docs' probe-file example (docs/getting-started.md), run against a real llama-server
PROBE_FILE = "examples/conversations_example.jsonl"
DIST = "pytest_cachecheck"


class Failed(Exception):
    """A release check failed; the message says which and why."""


def step(name: str, started: float) -> None:
    print(f"release: {name}: ok in {time.monotonic() - started:.1f} s", flush=True)


def run(cmd: Sequence[str], *, cwd: Path = ROOT, env: Optional[Dict[str, str]] = None,
        ok: Sequence[int] = (0,)) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=str(cwd), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if proc.returncode not in ok:
        raise Failed(f"{' '.join(str(c) for c in cmd)} exited with {proc.returncode} (expected "
                     f"{' or '.join(map(str, ok))}):\n{proc.stdout[-6000:]}")
    return proc.stdout


def tools() -> Path:
    """The cached venv with build, twine and mkdocs (made once per pin set)."""
    venv = cache_dir() / "release-tools" / hashlib.sha256(" ".join(TOOLS).encode()).hexdigest()[:12]
    python = venv / "bin" / "python"
    marker = venv / ".complete"
    if not marker.is_file():
        run([sys.executable, "-m", "venv", "--clear", venv])
        run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *TOOLS])
        marker.write_text(" ".join(TOOLS) + "\n")
    return python


def user_env(venv: Path) -> Dict[str, str]:
    """The environment of a user of the venv: its bin first, nothing of this checkout on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    return env


def package_files() -> List[str]:
    """Every file of the package git tracks (what a user must get)."""
    out = run(["git", "ls-files", "pytest_cachecheck"])
    return sorted(line for line in out.splitlines() if line)


def check_artifacts(dist: Path) -> Path:
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise Failed(f"expected one wheel and one sdist in {dist}, found {[p.name for p in dist.iterdir()]}")
    wheel, sdist = wheels[0], sdists[0]
    for artifact in (wheel, sdist):
        if f"-{__version__}" not in artifact.name:
            raise Failed(f"{artifact.name} is not version {__version__} (pytest_cachecheck.__version__)")
    wanted = package_files()
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        info = f"{DIST}-{__version__}.dist-info"
        metadata = zf.read(f"{info}/METADATA").decode()
        licence = zf.read(f"{info}/licenses/LICENSE").decode() if f"{info}/licenses/LICENSE" in names else ""
    missing = [f for f in wanted if f not in names]
    if missing:
        raise Failed(f"the wheel lacks package files git tracks: {missing}")
    if "MIT License" not in licence or "pytest-cachecheck contributors" not in licence:
        raise Failed(f"the wheel has no MIT LICENSE naming pytest-cachecheck contributors ({info}/licenses)")
    for line in ("License-Expression: MIT", f"Version: {__version__}", "Classifier: Framework :: Pytest",
                 "Project-URL: Documentation, "):
        if line not in metadata:
            raise Failed(f"the wheel's METADATA lacks {line!r}")
    with tarfile.open(sdist) as tf:
        top = f"{DIST}-{__version__}/"
        members = {m.name[len(top):] for m in tf.getmembers() if m.name.startswith(top)}
    missing = [f for f in ["LICENSE", "README.md", "pyproject.toml", *wanted] if f not in members]
    if missing:
        raise Failed(f"the sdist lacks {missing}")
    return wheel


def check_installed(venv: Path, home: Path) -> None:
    env = user_env(venv)
    python = venv / "bin" / "python"
    where = run([python, "-c", "import pytest_cachecheck as p; print(p.__file__, p.__version__)"], cwd=home,
                env=env).split()
    if not where[0].startswith(str(venv)) or where[1] != __version__:
        raise Failed(f"the venv imports pytest_cachecheck from {where[0]} (version {where[1]}), not the wheel")
    # pytest lists third-party plugins with the version of their distribution (the entry point's dist)
    shown = run(["pytest", "--version", "--version"], cwd=home, env=env)
    if f"pytest-cachecheck-{__version__}" not in shown:
        raise Failed(f"`pytest --version --version` does not list pytest-cachecheck-{__version__}:\n{shown}")


def check_demo(venv: Path, home: Path) -> None:
    """The README's demo, as written: red on purpose (random weights diverge), never for another reason."""
    out = run(DEMO_COMMAND, cwd=home, env=user_env(venv), ok=(1,))
    for wanted in (f"plugins: cachecheck-{__version__}", f"pytest-cachecheck {__version__} | mode llama.cpp",
                   "cachecheck verdict: FAIL (diverged)", "| inconclusive: 0 | errors: 0",
                   "pytest --cachecheck-url"):
        if wanted not in out:
            raise Failed(f"the demo's output lacks {wanted!r}:\n{out[-6000:]}")


def check_probe_file(venv: Path, home: Path) -> None:
    """The docs' probe-file example against a real llama-server (the demo model, the cached build)."""
    from pytest_cachecheck.serve import demo_model, ensure_llama_server

    binary = ensure_llama_server(print)
    probes = home / "conversations_example.jsonl"
    probes.write_bytes((ROOT / PROBE_FILE).read_bytes())
    report = home / "report.json"
    with LlamaServer(binary, demo_model(print), log_path=home / "llama-server.log") as server:
        run(["pytest", "--cachecheck-url", server.url, "--cachecheck-probes", probes.name,
             f"--cachecheck-report={report.name}", "--cachecheck-max-tokens=64"],
            cwd=home, env=user_env(venv), ok=(0, 1))
    summary = json.loads(report.read_text())["summary"]
    expected = sum(1 for line in probes.read_text().splitlines() if line.strip())
    if summary["probes"] != expected or summary["errors"] or summary["valid"] != expected:
        raise Failed(f"the probe-file run against llama-server: {summary} (expected {expected} valid probes, "
                     f"no errors)")


def wheel() -> None:
    started = time.monotonic()
    python = tools()
    step("tools", started)
    with tempfile.TemporaryDirectory(prefix="cachecheck-release-") as tmp:
        work = Path(tmp)
        started = time.monotonic()
        run([python, "-m", "build", "--outdir", work / "dist", ROOT])
        run([python, "-m", "twine", "check", "--strict", *sorted((work / "dist").iterdir())])
        built = check_artifacts(work / "dist")
        step(f"build and twine check ({built.name})", started)
        started = time.monotonic()
        venv, home = work / "venv", work / "home"
        home.mkdir()
        run([sys.executable, "-m", "venv", venv])
        run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             f"{built}[demo]"], cwd=home)
        check_installed(venv, home)
        step("fresh venv with the wheel", started)
        started = time.monotonic()
        check_demo(venv, home)
        step(" ".join(DEMO_COMMAND), started)
        started = time.monotonic()
        check_probe_file(venv, home)
        step(f"{PROBE_FILE} against llama-server", started)


def docs() -> None:
    started = time.monotonic()
    python = tools()
    with tempfile.TemporaryDirectory(prefix="cachecheck-docs-") as tmp:
        run([python, "-m", "mkdocs", "build", "--strict", "--config-file", ROOT / "mkdocs.yml",
             "--site-dir", Path(tmp) / "site"], env=dict(os.environ, PYTHONPATH=str(ROOT)))
        if not (Path(tmp) / "site" / "options" / "index.html").is_file():
            raise Failed("mkdocs built no options page")
    step("mkdocs build --strict", started)


def main(argv: List[str]) -> int:
    checks = {"wheel": wheel, "docs": docs}
    if len(argv) != 1 or argv[0] not in checks:
        print("usage: python3 -m tests.support.release {wheel|docs}", file=sys.stderr)
        return 2
    try:
        checks[argv[0]]()
    except (Failed, subprocess.SubprocessError, OSError) as exc:
        print(f"release: {argv[0]}: FAILED: {exc}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
