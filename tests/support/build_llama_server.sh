#!/usr/bin/env bash
# Build (or reuse the cached) llama-server; last stdout line is its path. See pytest_cachecheck/llama_server.py.
cd "$(dirname "${BASH_SOURCE[0]}")/../.." && PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec python3 -m pytest_cachecheck.llama_server build
