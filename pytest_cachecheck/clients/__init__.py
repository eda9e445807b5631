"""Server clients: one module per server kind behind the small :class:`~.base.ChatClient` interface.

A new server kind is one new module with its ``ChatClient`` subclass, and one entry in ``CLIENTS``; outside
the package, a plugin or conftest.py returns its subclass from the ``pytest_cachecheck_server_kinds`` hook
(:mod:`..hookspecs`), and detection tries it before the built-in kinds.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence, Type

from ..errors import ConfigError
from ..text import printable
from .base import CachePlan, ChatClient, Findings, Reply, ServerInfo
from .http import Http
from .llama_cpp import LlamaCppClient
from .openai import OpenAIClient
from .sglang import SglangClient
from .vllm import VllmClient

#: server kind -> client class, in the order detection tries them (the generic one last)
CLIENTS: Dict[str, Type[ChatClient]] = {
    "llama.cpp": LlamaCppClient,
    "sglang": SglangClient,
    "vllm": VllmClient,
    "openai": OpenAIClient,
}


def plugin_kinds(results: Iterable[Any]) -> List[Type[ChatClient]]:
    """The client classes of the ``pytest_cachecheck_server_kinds`` hook's results (one list from each
    implementation), in order, each once. Raises ConfigError for anything that is not a ChatClient
    subclass."""
    found: List[Type[ChatClient]] = []
    for result in results:
        for cls in result if isinstance(result, (list, tuple)) else [result]:
            if not (isinstance(cls, type) and issubclass(cls, ChatClient)):
                shown = f"{cls.__module__}.{cls.__qualname__}" if isinstance(cls, type) else \
                    f"{printable(repr(cls), 120)} ({type(cls).__name__})"
                raise ConfigError(f"pytest_cachecheck_server_kinds returned {shown}; it must return a list "
                                  f"of ChatClient subclasses (pytest_cachecheck.ChatClient)")
            if cls not in found:
                found.append(cls)
    return found


def detect_server(http: Http, model: Optional[str], prefer: Optional[str] = None,
                  kinds: Sequence[Type[ChatClient]] = ()) -> ChatClient:
    """The client for the server at ``http``, with the model to ask for (``model``, checked against what the
    server serves; ``prefer``: the first server's model, for the second of a pair): the first of ``kinds`` (a
    plugin's, see :func:`plugin_kinds`), then of the built-in ``CLIENTS``, whose ``detect`` recognises it.
    Raises RequestError or ServerSetupError (ModelChoiceError: the server does not serve ``model``) for a
    server that cannot be used. No request here generates text."""
    for cls in (*kinds, *CLIENTS.values()):
        info = cls.detect(http)
        if info is not None:
            break
    else:  # pragma: no cover - the generic client always answers
        raise AssertionError("no client detected the server")
    cls.resolve_model(http, info, model, prefer)
    return cls(http, info)


__all__ = ["CLIENTS", "CachePlan", "ChatClient", "Findings", "Http", "LlamaCppClient", "OpenAIClient", "Reply",
           "ServerInfo", "SglangClient", "VllmClient", "detect_server", "plugin_kinds"]
