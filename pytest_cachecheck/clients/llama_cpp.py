"""llama.cpp's llama-server: ``/v1/chat/completions`` with per-request ``cache_prompt``.

Detected by ``GET /props``. It serves one model, whatever a request asks for, under the names ``/props`` and
``/v1/models`` give it: its aliases (``--alias``) and its model file; the run reports the file's name, and
``--cachecheck-model`` must be one of those names. The hit counter is ``timings.cache_n`` (the same value as
``usage.prompt_tokens_details.cached_tokens``), always reported. ``"samplers": ["temperature"]`` leaves
only the greedy arg-max, so no penalty or GGUF default can act; ``"id_slot": 0`` pins the one slot.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import ModelChoiceError, RequestError
from .base import CachePlan, ChatClient, Findings, ServerInfo, counter, get_json, some_names
from .http import Http

# Two unrelated passages of about 150 tokens each, for the host-memory cache check.
#: the setup problem of a host-memory prompt cache that restores state (a warning under --cachecheck-order)
HOST_CACHE_PROBLEM = "llama-server restores prompts from its host-memory prompt cache"
_PASSAGE_A = (
    "Describe, in order, how a small bakery prepares for the morning: the ovens are lit before dawn, the "
    "sourdough starter is fed and left to rise, flour and salt are weighed for the first batch, the dough "
    "is kneaded, divided and shaped into loaves, croissants are laminated with cold butter and folded "
    "three times, trays are proofed in a warm cabinet, the first loaves are scored and baked with steam, "
    "the shelves are stocked, the coffee machine is cleaned and warmed, and the chalkboard is written "
    "with the day's specials before the door opens at seven."
)
_PASSAGE_B = (
    "List the steps a ship's crew follows when a storm is forecast at sea: secure every hatch and "
    "porthole, lash the deck cargo with extra chains, check the bilge pumps and the emergency generator, "
    "plot a course away from the worst of the weather, reduce speed to ease the pounding of the waves, "
    "brief the watch on the lifeboat stations, stow loose equipment in the galley and the engine room, "
    "keep the radio on the coast guard channel, log the barometer every hour, and rest the off-duty "
    "sailors so that they are fresh when the wind rises after midnight."
)

_SPLIT = re.compile(r"-\d{5}-of-\d{5}$")  # the part suffix of a split model's files (gguf-split)


def _model_names(props: Dict[str, Any], models: Optional[Dict[str, Any]]) -> Tuple[Optional[str], List[str]]:
    """(the name the run reports, every name the server gives its model). The names: the ``/v1/models`` ids
    and aliases, ``/props`` ``model_alias`` (the first alias, else the model path, as given to ``-m``, or
    the ``-hf`` repository) and the model file: its path, its file name, that name without ``.gguf``, and
    without a split model's part suffix. The run reports the file name, else the alias."""
    names: List[str] = []
    listed = models.get("data") if isinstance(models, dict) else None
    for entry in listed if isinstance(listed, list) else []:
        if isinstance(entry, dict):
            aliases = entry.get("aliases") if isinstance(entry.get("aliases"), list) else []
            names += [n for n in [entry.get("id"), *aliases] if isinstance(n, str) and n]
    alias = props.get("model_alias")
    if isinstance(alias, str) and alias:
        names.append(alias)
    path = props.get("model_path")
    own = names[0] if names else None
    if isinstance(path, str) and path:
        own = re.split(r"[\\/]", path)[-1]
        stem = own[:-5] if own.lower().endswith(".gguf") else own
        names = [own] + names + [path, stem, _SPLIT.sub("", stem)]
    return own, list(dict.fromkeys(names))


class LlamaCppClient(ChatClient):
    kind = "llama.cpp"
    reporting_flag = "llama-server reports timings.cache_n always: is this a stock llama-server?"
    names_model = False  # /props names the model file, which two servers of one model may name apart

    @classmethod
    def detect(cls, http: Http) -> Optional[ServerInfo]:
        props = get_json(http, "/props")
        if props is None or not ("build_info" in props or "default_generation_settings" in props):
            return None
        settings = props.get("default_generation_settings")
        own, names = _model_names(props, get_json(http, "/v1/models"))
        return ServerInfo(
            kind=cls.kind,
            build=str(props.get("build_info")) if props.get("build_info") else None,
            model=own, names=names,
            details={"total_slots": props.get("total_slots"),
                     "n_ctx": settings.get("n_ctx") if isinstance(settings, dict) else None})

    @classmethod
    def resolve_model(cls, http: Http, info: ServerInfo, wanted: Optional[str],
                      prefer: Optional[str]) -> None:
        # one model, served unasked: a name given must be one of the server's for it; none given, the run
        # reports the server's own (``prefer`` does not apply: two servers may name one model's file apart)
        if not wanted:
            return
        if wanted not in info.names:
            own = info.model or ""
            shown = [n for n in info.names if n == own or not n.endswith(("/" + own, "\\" + own))]
            serves = (f"named {some_names(shown)} (its file name with or without .gguf, and any "
                      f"--alias); give one of those, or leave --cachecheck-model out" if shown else
                      "and names it nowhere (/props has no model_path or model_alias); leave "
                      "--cachecheck-model out")
            raise ModelChoiceError(f"--cachecheck-model {wanted!r} is not served by {http.shown}: "
                                   f"llama-server serves one model, {serves}")
        info.model = wanted

    def setup_problems(self) -> List[str]:
        shared = self.shared_slots()
        return [shared] if shared else []

    def shared_slots(self) -> Optional[str]:
        """The setup problem of a server with several slots (None with one): the batch kind needs them."""
        slots = self.info.details.get("total_slots")
        if isinstance(slots, int) and not isinstance(slots, bool) and slots > 1:
            return (f"llama-server runs {slots} slots that share one cache, so another request can take the "
                    f"state turn 2 should reuse; start it with -np 1 --cache-ram 0")
        return None

    def cache_plan(self, own_setting: bool = False) -> CachePlan:
        # cache_prompt false forces a clean start and still writes the slot that turn 2 then reuses
        return CachePlan({"cache_prompt": False}, {} if own_setting else {"cache_prompt": True}, clean_start=True)

    def scratch(self) -> Optional[Dict[str, Any]]:
        return {"cache_prompt": False}

    def unpinned(self) -> Dict[str, Any]:
        return {"id_slot": -1}  # the body pins slot 0, where concurrent requests would queue

    def beside_cache(self, i: int) -> Dict[str, Any]:
        # slot 0 holds the cache path's state: an unpinned request picks the slot whose prompt it shares most
        # with (the chat template's opening, on a real llama-server), so it would take slot 0; slots 1..N
        return {"id_slot": i + 1}

    def no_early_stop(self) -> Dict[str, Any]:
        return {"ignore_eos": True}

    def body(self, messages: List[Dict[str, Any]], max_tokens: int) -> Dict[str, Any]:
        return {"messages": messages, "temperature": 0, "max_tokens": max_tokens, "stream": False,
                "samplers": ["temperature"], "id_slot": 0}

    def cached_tokens(self, data: Dict[str, Any], usage: Dict[str, Any], where: str) -> Optional[int]:
        timings = data.get("timings")
        cached = counter(timings, ("cache_n",), where, "timings.") if isinstance(timings, dict) else None
        return cached if cached is not None else super().cached_tokens(data, usage, where)

    def render(self, messages: List[Dict[str, Any]], tools: Optional[List[Dict[str, Any]]] = None
               ) -> Optional[Sequence[Any]]:
        # POST /apply-template: the chat template's text, exactly as a chat request would be prompted
        status, data = self.http.request("POST", "/apply-template", {"messages": messages,
                                                                      **({"tools": tools} if tools else {})})
        if status != 200 or not isinstance(data, dict) or not isinstance(data.get("prompt"), str):
            return None
        return data["prompt"]

    def token_pieces(self, text: str) -> Optional[List[str]]:
        try:
            data = self.http.post("/tokenize", {"content": text, "with_pieces": True})
        except RequestError:
            return None
        tokens = data.get("tokens")
        if not isinstance(tokens, list):
            return None
        pieces = []
        for t in tokens:
            if not isinstance(t, dict) or not isinstance(t.get("piece"), str):
                return None
            pieces.append(t["piece"])
        return pieces

    def check_reporting(self, found: Findings) -> None:
        pass  # llama-server always reports cache_n; a server that does not fails the probes by name

    def check_host_cache(self, found: Findings) -> None:
        """Is a prompt the slot no longer holds restored from the host-memory prompt cache (--cache-ram)?

        A, then B (a different prompt: llama-server saves A's state to the host cache, when it has one,
        because B keeps less than half of the slot), then A again with cache_prompt on. Without the host
        cache the third request can reuse only what A shares with B (the template's opening); with it, the
        server loads A's saved state and reuses nearly all of A.
        """
        a = [{"role": "user", "content": _PASSAGE_A}]
        b = [{"role": "user", "content": _PASSAGE_B}]
        self.chat(a, max_tokens=1, cache={"cache_prompt": False})
        shared = self.chat(b, max_tokens=1, cache={"cache_prompt": True}).cached_tokens
        again = self.chat(a, max_tokens=1, cache={"cache_prompt": True})
        if shared is None or again.cached_tokens is None or again.prompt_tokens is None:
            return
        found.notes.append(f"host-memory prompt cache: a prompt of {again.prompt_tokens} tokens sent again after "
                           f"another reused {again.cached_tokens} tokens (the two share {shared})")
        if again.cached_tokens > shared + (again.prompt_tokens - shared) // 2:
            found.problems.append(
                f"{HOST_CACHE_PROBLEM}: a prompt sent again after "
                f"another reused {again.cached_tokens} of its {again.prompt_tokens} tokens, though the slot then "
                f"held only the {shared} they share, so a request can reuse state that its own turn 1 did not "
                f"leave; start it with --cache-ram 0")
