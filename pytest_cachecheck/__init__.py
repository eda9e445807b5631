"""pytest-cachecheck: measure how often an LLM server's prompt cache changes its greedy answers."""

__version__ = "0.1.0"
