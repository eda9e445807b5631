#!/usr/bin/env bash
# The project's test command (README "Run the tests"; .ci/run calls exactly this).
# Installs what the tests need, builds or reuses llama-server and installs or reuses SGLang (both cached
# under ~/.cache/pytest-cachecheck), then runs the whole suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "tests/run.sh: installing Debian's chromium for the HTML render test" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 \
    || echo "tests/run.sh: chromium could not be installed; the HTML render test skips (fails with CI set)" >&2
fi
python3 -m pytest_cachecheck.llama_server build >/dev/null
# SGLang 0.5.23 in its own venv for tests/test_e2e_sglang.py (about 3.5 minutes and 6.2 GB the first time)
python3 -m tests.support.sglang_server install >/dev/null \
  || echo "tests/run.sh: SGLang could not be installed; its tests skip (fail with CI set)" >&2
exec python3 -m pytest "$@"
