"""Tell what kind of server answers at a URL, and which model to ask for.

llama-server answers ``GET /props`` with its ``build_info``; SGLang answers ``GET /server_info`` (older
releases ``/get_server_info``); vLLM answers ``GET /version``. Anything else is a plain OpenAI-compatible
server. No request here generates text (SGLang's ``/health`` does, so it is never called).
"""

from __future__ import annotations

import os
from typing import Any, List, Optional

from .clients.base import Http, ServerInfo
from .errors import RequestError, ServerSetupError


def _ok_dict(http: Http, path: str) -> Optional[dict]:
    status, data = http.get(path, timeout=min(http.timeout, 30.0))
    if status in (401, 403):
        raise RequestError(f"GET {path} to {http.shown}: HTTP {status}: the server refused the credentials "
                           f"(check --cachecheck-api-key)", status=status, where=f"GET {path}")
    if status == 503:
        raise RequestError(f"GET {path} to {http.shown}: HTTP 503: the server is not ready (still loading?)",
                           status=status, where=f"GET {path}")
    return data if status == 200 and isinstance(data, dict) else None


def _listed_models(http: Http) -> List[str]:
    data = _ok_dict(http, "/v1/models")
    if not data or not isinstance(data.get("data"), list):
        return []
    return [m["id"] for m in data["data"] if isinstance(m, dict) and isinstance(m.get("id"), str)]


def detect_server(http: Http, model: Optional[str]) -> ServerInfo:
    """Detect the server kind, its build and the model to use. Raises on a server that cannot be used."""
    props = _ok_dict(http, "/props")
    if props is not None and ("build_info" in props or "default_generation_settings" in props):
        path = props.get("model_path")
        info = ServerInfo(
            kind="llama.cpp",
            build=str(props.get("build_info")) if props.get("build_info") else None,
            model=os.path.basename(path) if isinstance(path, str) and path else props.get("model_alias"),
            details={
                "total_slots": props.get("total_slots"),
                "n_ctx": (props.get("default_generation_settings") or {}).get("n_ctx")
                if isinstance(props.get("default_generation_settings"), dict) else None,
            },
        )
        if model:
            info.model = model
        return info
    server_info = _ok_dict(http, "/server_info") or _ok_dict(http, "/get_server_info")
    if server_info is not None and any(k in server_info for k in ("page_size", "disable_radix_cache",
                                                                     "enable_cache_report")):
        info = ServerInfo(kind="sglang", build=_str(server_info.get("version")), details={
            k: server_info.get(k) for k in ("page_size", "disable_radix_cache", "enable_cache_report",
                                            "sampling_defaults", "enable_deterministic_inference")
            if k in server_info})
    else:
        version = _ok_dict(http, "/version")
        if version is not None and isinstance(version.get("version"), str):
            info = ServerInfo(kind="vllm", build=version["version"])
        else:
            info = ServerInfo(kind="openai")
    info.models = _listed_models(http)
    info.model = choose_model(info.models, model, http.shown)
    return info


def choose_model(listed: List[str], wanted: Optional[str], shown_url: str) -> str:
    if wanted:
        if listed and wanted not in listed:
            raise ServerSetupError(f"--cachecheck-model {wanted!r} is not served by {shown_url}; it lists: "
                                   + ", ".join(listed))
        return wanted
    if len(listed) == 1:
        return listed[0]
    if not listed:
        raise ServerSetupError(f"{shown_url} lists no model at /v1/models; give --cachecheck-model NAME")
    raise ServerSetupError(f"{shown_url} serves several models; choose one with --cachecheck-model: "
                           + ", ".join(listed))


def _str(value: Any) -> Optional[str]:
    return str(value) if value is not None else None
