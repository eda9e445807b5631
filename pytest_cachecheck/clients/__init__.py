"""Server clients: one module per server kind behind the small :class:`~.base.ChatClient` interface.

A new server kind is one new module with its ``ChatClient`` subclass, and one entry in ``CLIENTS``.
"""

from __future__ import annotations

from typing import Dict, Optional, Type

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


def detect_server(http: Http, model: Optional[str], prefer: Optional[str] = None) -> ChatClient:
    """The client for the server at ``http``, with the model to ask for (``model``, checked against what the
    server serves; ``prefer``: the first server's model, for the second of a pair). Raises RequestError or
    ServerSetupError (ModelChoiceError: the server does not serve ``model``) for a server that cannot be
    used. No request here generates text."""
    for cls in CLIENTS.values():
        info = cls.detect(http)
        if info is not None:
            break
    else:  # pragma: no cover - the generic client always answers
        raise AssertionError("no client detected the server")
    cls.resolve_model(http, info, model, prefer)
    return cls(http, info)


__all__ = ["CLIENTS", "CachePlan", "ChatClient", "Findings", "Http", "LlamaCppClient", "OpenAIClient", "Reply",
           "ServerInfo", "SglangClient", "VllmClient", "detect_server"]
