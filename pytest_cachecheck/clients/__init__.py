"""Server clients: one module per server kind behind the small :class:`~.base.ChatClient` interface."""

from __future__ import annotations

from typing import Dict, Type

from .base import ChatClient, Http, Reply, ServerInfo
from .llama_cpp import LlamaCppClient
from .openai_compat import OpenAICompatClient

#: server kind -> client class; a new server kind is one new module and one line here.
CLIENTS: Dict[str, Type[ChatClient]] = {
    "llama.cpp": LlamaCppClient,
    "vllm": OpenAICompatClient,
    "sglang": OpenAICompatClient,
    "openai": OpenAICompatClient,
}

__all__ = ["CLIENTS", "ChatClient", "Http", "LlamaCppClient", "OpenAICompatClient", "Reply", "ServerInfo"]
