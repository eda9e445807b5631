"""Tell what kind of server answers at a URL, and which model to ask for.

llama-server answers ``GET /props`` with its ``build_info``; SGLang answers ``GET /server_info`` (older
releases ``/get_server_info``); vLLM answers ``GET /version``. Anything else is a plain OpenAI-compatible
server. No request here generates text (SGLang's ``/health`` does, so it is never called).
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional

from .clients.base import ServerInfo
from .clients.http import Http
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


def detect_server(http: Http, model: Optional[str], prefer: Optional[str] = None) -> ServerInfo:
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
            info = ServerInfo(kind="vllm", build=version["version"], details=_vllm_cache_config(http))
        else:
            info = ServerInfo(kind="openai")
    info.models = _listed_models(http)
    if model is None and prefer is not None and prefer in info.models:
        model = prefer  # the second server of a pair: the first server's model, where it serves it
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


def _vllm_cache_config(http: Http) -> Dict[str, Any]:
    """Block size and prefix caching from vLLM's ``vllm:cache_config_info`` metric labels, where served."""
    try:
        status, text = http.request("GET", "/metrics", timeout=min(http.timeout, 30.0), expect_json=False)
    except RequestError:
        return {}  # metrics are optional; detection goes on without them
    if status != 200 or not isinstance(text, str):
        return {}
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("{", 1)[1].rsplit("}", 1)[0]))
            out: Dict[str, Any] = {}
            if labels.get("block_size", "").isdigit():
                out["block_size"] = int(labels["block_size"])
            if labels.get("enable_prefix_caching") in ("True", "False"):
                out["enable_prefix_caching"] = labels["enable_prefix_caching"] == "True"
            return out
    return {}


def block_size(info: ServerInfo) -> Optional[int]:
    """The hit granularity the server reports: vLLM block size or SGLang page size."""
    value = info.details.get("block_size", info.details.get("page_size"))
    return value if isinstance(value, int) and value > 0 else None


def prefix_caching(info: ServerInfo) -> Optional[bool]:
    """Whether the server says prefix caching is on (None when it does not say)."""
    if "enable_prefix_caching" in info.details:
        return bool(info.details["enable_prefix_caching"])
    if "disable_radix_cache" in info.details and info.details["disable_radix_cache"] is not None:
        return not info.details["disable_radix_cache"]
    return None


def setup_problems(mode: str, cache: ServerInfo, nocache: Optional[ServerInfo]) -> List[str]:
    """Settings that would spoil the measurement, each with its fix."""
    problems = []
    slots = cache.details.get("total_slots")
    if cache.kind == "llama.cpp" and isinstance(slots, int) and slots > 1:
        problems.append(f"llama-server runs {slots} slots that share one cache, so another request can "
                        f"take the state turn 2 should reuse; start it with -np 1 --cache-ram 0")
    if prefix_caching(cache) is False and mode == "one-server":
        problems.append(f"prefix caching is off on the {cache.kind} server under test; start it without "
                        f"--no-enable-prefix-caching / --disable-radix-cache")
    if nocache is not None:
        if prefix_caching(nocache) is True:
            problems.append(f"the nocache server ({nocache.kind}) reports prefix caching on: both URLs may "
                            f"reach the same server (a proxy or port forward), or start the second server "
                            f"with --no-enable-prefix-caching (vLLM) or --disable-radix-cache (SGLang)")
        if cache.kind != "llama.cpp" and nocache.kind != "llama.cpp" and cache.model and nocache.model \
                and cache.model != nocache.model:
            problems.append(f"the two servers serve different models ({cache.model!r} and {nocache.model!r}); "
                            f"serve the same model on both")
    return problems
