"""The version matrix: the plugin-level tests on the oldest and the newest pytest and pytest-xdist the
plugin supports, and on the newest pytest without pytest-xdist, each in a venv of its own.

``python3 -m tests.support.matrix`` (``tests/run.sh`` runs it after the main suite). The venvs are cached
under the project cache (``~/.cache/pytest-cachecheck/matrix``), keyed by their pins; the plugin is
installed editable into each, so a venv is reused across runs. Prints one line per environment with its
outcome and time; exits 1 when any environment fails.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Sequence, Tuple

from pytest_cachecheck.llama_server import cache_dir

ROOT = Path(__file__).resolve().parents[2]
#: (name, pins): the oldest supported (with the oldest requests), the newest of the 8 series, and the newest
#: pytest without xdist. The main suite itself runs on the newest pytest and pytest-xdist (tests/run.sh).
ENVIRONMENTS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("pytest 7.4 + xdist 3.5", ("pytest==7.4.4", "pytest-xdist==3.5.0", "requests==2.28.2")),
    ("pytest 8.4 + xdist 3.8", ("pytest==8.4.2", "pytest-xdist==3.8.0")),
    ("pytest 9.2, no xdist", ("pytest==9.2.0",)),
    # the plugins users combine, pytest-randomly among them (it reorders every test it sees, so it stays out
    # of the main suite's environment): only the tests of what pytest and plugins do around the items
    ("pytest 9.2 + xdist 3.8 + plugins", ("pytest==9.2.0", "pytest-xdist==3.8.0", "pytest-timeout==2.4.0",
                                          "pytest-rerunfailures==16.7", "pytest-randomly==5.1.0")),
)
COMMON = ("responses", "pytest-json-report")
TESTS = ("tests/test_xdist.py", "tests/test_plugin.py", "tests/test_suites.py", "tests/test_around.py", "-m", "compat")
#: environments that run other tests than TESTS
ENV_TESTS = {"pytest 9.2 + xdist 3.8 + plugins": ("tests/test_around.py", "-p", "no:randomly")}


def _venv(pins: Sequence[str]) -> Path:
    key = hashlib.sha256(" ".join(pins).encode()).hexdigest()[:12]
    return cache_dir() / "matrix" / key


def prepare(pins: Sequence[str]) -> Path:
    """A venv with ``pins``, the common test dependencies and the plugin (editable)."""
    venv = _venv(pins)
    python = venv / "bin" / "python"
    marker = venv / ".complete"
    quiet = ["--quiet", "--disable-pip-version-check"]
    stamp = f"{' '.join(pins)} {ROOT}\n"
    if not marker.is_file() or marker.read_text() != stamp:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        # the plugin's own requirements resolve here, beside the pins (the oldest requests among them)
        subprocess.run([str(python), "-m", "pip", "install", *quiet, *pins, *COMMON, "-e", str(ROOT)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        marker.write_text(stamp)
    return python


def main(argv: List[str]) -> int:
    failed = []
    for name, pins in ENVIRONMENTS:
        start = time.monotonic()
        try:
            python = prepare(pins)
        except subprocess.CalledProcessError as exc:
            print(f"matrix: {name}: could not be installed ({exc}):\n{(exc.stderr or b'').decode()[-3000:]}",
                  flush=True)
            failed.append(name)
            continue
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        workers = ["-n", "2"] if any(p.startswith("pytest-xdist") for p in pins) else []
        cmd = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers, *ENV_TESTS.get(name, TESTS),
               *argv]
        proc = subprocess.run(cmd,
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        last = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
        print(f"matrix: {name}: {'ok' if proc.returncode == 0 else 'FAILED'} in "
              f"{time.monotonic() - start:.0f} s: {last}", flush=True)
        if proc.returncode != 0:
            print(proc.stdout[-6000:], flush=True)
            failed.append(name)
    if failed:
        print("matrix: failed: " + "; ".join(failed), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
