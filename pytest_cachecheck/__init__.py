"""pytest-cachecheck: measure how often an LLM server's prompt cache changes its greedy answers.

The public API is what ``__all__`` names: for tests, ``CacheCheck`` (what the ``cachecheck`` fixture gives),
the records it returns (``ProbeRecord``, ``EpisodeRecord``), their ``Outcome``, a run's ``Status`` and the
errors; for a plugin that adds a server kind (the ``pytest_cachecheck_server_kinds`` hook,
:mod:`pytest_cachecheck.hookspecs`), the client interface ``ChatClient``, what it works with and the
built-in kinds to subclass. Every other module is internal.

Importing the package imports none of its modules (nor pytest or requests): each name is imported when it
is first used (PEP 562), so a pytest run with the plugin off does not load the measurement. The version is
written here only; ``pyproject.toml`` reads it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict, List

__version__ = "0.1.0"

#: public name -> the module that defines it
_LAZY: Dict[str, str] = {
    "CacheCheck": "._api",
    "ProbeRecord": ".model",
    "EpisodeRecord": ".model",
    "Outcome": ".model",
    "Status": ".model",
    "CachecheckError": ".errors",
    "RequestError": ".errors",
    "ServerSetupError": ".errors",
    "ChatClient": ".clients",
    "ServerInfo": ".clients",
    "CachePlan": ".clients",
    "Findings": ".clients",
    "Reply": ".clients",
    "Http": ".clients",
    "LlamaCppClient": ".clients",
    "OpenAIClient": ".clients",
    "SglangClient": ".clients",
    "VllmClient": ".clients",
}

#: the public names (a literal, for type checkers and linters; tests/test_api.py holds it to ``_LAZY``)
__all__ = [
    "__version__",
    "CacheCheck", "ProbeRecord", "EpisodeRecord", "Outcome", "Status",
    "CachecheckError", "RequestError", "ServerSetupError",
    "ChatClient", "ServerInfo", "CachePlan", "Findings", "Reply", "Http",
    "LlamaCppClient", "OpenAIClient", "SglangClient", "VllmClient",
]

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ imports these
    from ._api import CacheCheck as CacheCheck
    from .clients import CachePlan as CachePlan
    from .clients import ChatClient as ChatClient
    from .clients import Findings as Findings
    from .clients import Http as Http
    from .clients import LlamaCppClient as LlamaCppClient
    from .clients import OpenAIClient as OpenAIClient
    from .clients import Reply as Reply
    from .clients import ServerInfo as ServerInfo
    from .clients import SglangClient as SglangClient
    from .clients import VllmClient as VllmClient
    from .errors import CachecheckError as CachecheckError
    from .errors import RequestError as RequestError
    from .errors import ServerSetupError as ServerSetupError
    from .model import EpisodeRecord as EpisodeRecord
    from .model import Outcome as Outcome
    from .model import ProbeRecord as ProbeRecord
    from .model import Status as Status


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # imported once
    return value


def __dir__() -> List[str]:
    return sorted({*globals(), *_LAZY})
