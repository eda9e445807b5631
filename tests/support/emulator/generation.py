"""The OpenAI-compatible generation endpoints (``/v1/chat/completions``, ``/v1/completions``): request
validation worded as each server words it, the serialized generation against the prefix cache, and the
response, usage, logprobs and stream bodies of vLLM and SGLang. A mixin of :class:`Emulator`.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

from .config import EmulatorConfig, _RequestError
from .text import (
    EOS_TOKEN_ID,
    THINK_END,
    THINK_START,
    PrefixCache,
    detokenize,
    diverged_answer,
    generate_answer,
    generate_reasoning,
    generate_tool_call,
    render_chat,
    split_reasoning,
    thinking_output,
    token_str,
    tokenize,
)


class _Generation:
    """Chat and completion requests; the state it uses is the emulator's."""

    config: EmulatorConfig
    served_requests: int
    _lock: threading.Lock
    _count_lock: threading.Lock
    _computing: List[List[bool]]
    _slots: Optional[threading.Semaphore]
    _stopping: threading.Event
    _cache: PrefixCache
    _metrics: Dict[str, int]
    _fingerprint: str

    @property
    def _vllm(self) -> bool:
        return self.config.flavor == "vllm"

    def _validation_error(
        self, message: str, param: Optional[str], kind: str = "value_error"
    ) -> _RequestError:
        """A request-schema error, as each server's RequestValidationError handler words it. vLLM 0.32.0:
        ``1 validation error:\n  {'type': 'missing', 'loc': 'body.messages', 'msg': 'Field required', ...}``
        with ``param`` the location."""
        if self._vllm:
            loc = f"body.{param}" if param and param != "body" else "body"
            return _RequestError(400, f"1 validation error:\n  {{'type': '{kind}', 'loc': '{loc}', 'msg': "
                                      f"'{message}', 'input': '<request>'}}", "Bad Request", loc)
        if param == "body":  # what pydantic says about a body that is not JSON
            return _RequestError(400, "1 validation error:\n  {'type': 'json_invalid', 'loc': ('body', 1), "
                                 "'msg': 'JSON decode error'}", "Bad Request", None)
        return _RequestError(
            400,
            f"1 validation error:\n  {{'loc': ('body', {param!r}), 'msg': {message!r}}}",
            "Bad Request",
            None,
        )

    def _check_model(self, body: Dict[str, Any]) -> str:
        cfg = self.config
        model = body.get("model")
        if model is None:
            return cfg.model if self._vllm else "default"  # SGLang's DEFAULT_MODEL_NAME
        if not isinstance(model, str):
            raise self._validation_error("Input should be a valid string", "model")
        if model in cfg.served_models:
            # vLLM answers under its first served name whichever it was asked for (OpenAIServingModels.
            # model_name, vllm/entrypoints/openai/models/serving.py in 0.32.0); SGLang echoes the name
            return cfg.model if self._vllm else model
        if self._vllm:
            raise _RequestError(404, f"The model `{model}` does not exist. Valid aliases: "
                                     f"{', '.join(cfg.served_models)}.", "NotFoundError", "model")
        return model  # SGLang 0.5.23 serves whatever name a chat request gives, and echoes it

    def _namespace(self, body: Dict[str, Any]) -> Optional[str]:
        """Validate the salt fields; return the cache namespace they select (None = the shared one)."""
        salt = body.get("cache_salt")
        if self._vllm:
            if salt is not None:
                # real vLLM 0.32.0 answers both as a BadRequestError naming the parameter
                if not isinstance(salt, str) or not salt:
                    raise _RequestError(
                        400,
                        "Parameter 'cache_salt' must be a non-empty string if provided. "
                        "(parameter=cache_salt)",
                        "BadRequestError",
                        "cache_salt",
                    )
                if len(salt) > 128 or any(c in salt for c in "@/\\\x00"):
                    raise _RequestError(
                        400,
                        "Parameter 'cache_salt' must be at most 128 characters and must not contain "
                        "'@', '/', '\\\\', or NUL. (parameter=cache_salt)",
                        "BadRequestError",
                        "cache_salt",
                    )
            if not self.config.honor_salt or salt is None:
                return None
            return "vllm\x00" + salt
        extra = body.get("extra_key")
        for name, value in (("cache_salt", salt), ("extra_key", extra)):
            if value is not None and not isinstance(value, (str, list)):  # the field is str | list[str]
                raise _RequestError(
                    400,
                    f"2 validation errors:\n  {{'type': 'list_type', 'loc': ('body', '{name}', 'list[str]'), "
                    f"'msg': 'Input should be a valid list'}}\n  {{'type': 'string_type', 'loc': ('body', "
                    f"'{name}', 'str'), 'msg': 'Input should be a valid string'}}",
                    "Bad Request",
                    None,
                )
            if value is not None and not isinstance(value, str):
                raise _RequestError(
                    400,
                    f"{name} must be a string for a single request, got {type(value).__name__}",
                    "BadRequestError",
                    name,
                )
        salt = salt or None  # SGLang: an empty string is no salt
        extra = extra or None
        if not self.config.honor_salt or (salt is None and extra is None):
            return None
        return f"sglang\x00{extra or ''}\x00{salt or ''}"

    def _max_tokens(self, body: Dict[str, Any], n_prompt: int) -> Optional[int]:
        cfg = self.config
        value = body.get("max_completion_tokens")
        name = "max_completion_tokens"
        if value is None:
            value, name = body.get("max_tokens"), "max_tokens"
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise self._validation_error("Input should be a valid integer", name)
        if value is not None and value < 1 and self._vllm:
            raise _RequestError(
                400, f"max_tokens must be at least 1, got {value}. (parameter={name}, value={value})",
                "BadRequestError", name
            )
        if value is not None and value < 0:  # SGLang generates nothing for 0 (SamplingParams.verify)
            raise _RequestError(400, f"max_new_tokens must be at least 0, got {value}.", "BadRequestError", None)
        if self._vllm and value is not None and value > cfg.max_model_len:
            raise _RequestError(
                400,
                f"{name}={value} cannot be greater than max_model_len={cfg.max_model_len}. Please request "
                f"fewer output tokens. (parameter={name}, value={value})",
                "BadRequestError",
                name,
            )
        if n_prompt >= cfg.max_model_len:
            if self._vllm:  # real vLLM 0.32.0 tokenizes at most max_model_len + 1 tokens to tell
                seen = min(n_prompt, cfg.max_model_len + 1)
                raise _RequestError(
                    400,
                    f"This model's maximum context length is {cfg.max_model_len} tokens. However, your "
                    f"prompt contains at least {seen} input tokens, which exceeds this limit even without "
                    f"any output tokens. Please reduce the length of the input prompt. "
                    f"(parameter=input_tokens, value={seen})",
                    "BadRequestError",
                    "input_tokens",
                )
            raise _RequestError(
                400,
                f"The input ({n_prompt} tokens) is longer than the model's context length "
                f"({cfg.max_model_len} tokens).",
                "BadRequestError",
            )
        # vLLM 0.32.0 serves a prompt + max_tokens longer than the context; the answer stops at its end
        room = cfg.max_model_len - n_prompt
        return min(value, room) if value is not None else room

    def _check_n(self, body: Dict[str, Any]) -> None:
        n = body.get("n", 1)
        if n is None or n == 1:
            return
        temperature = body.get("temperature")
        if self._vllm and (
            temperature is None or (isinstance(temperature, (int, float)) and temperature < 1e-5)
        ):
            raise _RequestError(
                400, f"n must be 1 when using greedy sampling, got {n}.", "BadRequestError", None
            )
        raise _RequestError(
            400, f"n={n} is not supported by the emulator (it serves n=1 only)", "BadRequestError", "n"
        )

    def _logprobs_k(self, body: Dict[str, Any]) -> Optional[int]:
        """None = no logprobs; else the number of top alternatives per token."""
        want = body.get("logprobs")
        top = body.get("top_logprobs")
        if top is not None and (not isinstance(top, int) or isinstance(top, bool)):
            raise self._validation_error("Input should be a valid integer", "top_logprobs")
        if not want:
            if top and self._vllm:
                raise _RequestError(
                    400,
                    "when using `top_logprobs`, `logprobs` must be set to true. (parameter=top_logprobs)",
                    "BadRequestError",
                    "top_logprobs",
                )
            return None
        k = 0 if top is None else top
        if k == -1:
            k = 20
        if k < 0:
            raise _RequestError(
                400,
                f"`top_logprobs` must be a positive value or -1. (parameter=top_logprobs, value={k})",
                "BadRequestError",
                "top_logprobs",
            )
        if k > 20:
            raise _RequestError(
                400,
                f"Requested sample logprobs of {k}, which is greater than max allowed: 20 "
                f"(parameter=logprobs, value={k})",
                "BadRequestError",
                "logprobs",
            )
        return k

    def _should_diverge(self, prompt_text: str, messages: Any) -> bool:
        knob = self.config.diverge_on_hit
        if knob is None:
            return False
        if callable(knob):
            return bool(knob(messages))
        markers = [knob] if isinstance(knob, str) else list(knob)
        return any(marker in prompt_text for marker in markers)

    def _compute(self) -> bool:
        """The generation's compute time (``compute_seconds``, in a slot when ``slots`` bounds them); whether
        another generation computed at the same time (it was batched)."""
        cfg = self.config
        if not cfg.compute_seconds:
            return False
        if self._slots is not None:
            self._slots.acquire()
        try:
            mine = [False]
            with self._count_lock:
                for other in self._computing:
                    other[0] = mine[0] = True
                self._computing.append(mine)
            self._stopping.wait(cfg.compute_seconds)
            with self._count_lock:
                self._computing[:] = [c for c in self._computing if c is not mine]  # by identity
            return mine[0]
        finally:
            if self._slots is not None:
                self._slots.release()

    def _generate(
        self,
        prompt_ids: List[int],
        prompt_text: str,
        namespace: Optional[str],
        messages: Any,
        max_tokens: Optional[int],
        tools: Optional[List[Dict[str, Any]]] = None,
        tool_choice: Any = None,
    ) -> Dict[str, Any]:
        """Look up the cache, answer greedily, insert the request's blocks. Serialized: batch size one.
        With ``tools`` and a ``tool_choice`` that requires a call (``required`` or a named tool), the
        answer is that call (the emulated model never calls a tool unasked).

        With ``reasoning`` the output is :func:`thinking_output` (reasoning, then the answer) and every output
        token, reasoning included, is counted, cut by ``max_tokens`` and cached like any other."""
        cfg = self.config
        batched = self._compute()
        with self._lock:
            n_prompt = len(prompt_ids)
            cached = 0
            if cfg.prefix_caching:
                cached = self._cache.lookup(prompt_ids, namespace, n_prompt - 1)
                self._metrics["queries"] += n_prompt
                self._metrics["hits"] += cached
            answer = generate_answer(prompt_text)
            diverged = False
            flip = cached > 0 and self._should_diverge(prompt_text, messages)
            if tools and tool_choice not in (None, "auto", "none"):
                answer = generate_tool_call(prompt_text, tools, tool_choice, flip)
                diverged = flip
            elif flip or (batched and cfg.batch_variant):
                answer = diverged_answer(prompt_text, answer)
                diverged = True
            if cfg.diverge_on_hit_under_load and cached > 0 and batched and not tools:
                answer = diverged_answer("under load\x00" + prompt_text, answer)
                diverged = True
            full = thinking_output(generate_reasoning(prompt_text), answer) if cfg.reasoning else answer
            if max_tokens is not None and max_tokens <= len(full):
                text = full[:max_tokens]
                output_ids = tokenize(text)
                finish = "length"
            else:
                text = full
                output_ids = tokenize(text) + [EOS_TOKEN_ID]
                finish = "stop"
            if cfg.prefix_caching:
                # The last sampled token is never fed back, so its KV is never computed or cached, unless
                # SGLang's overlap scheduler ran the next decode step before it saw the EOS.
                ran_ahead = (not self._vllm and cfg.overlap_schedule and finish == "stop"
                             and (max_tokens is None or len(output_ids) < max_tokens))
                kept = prompt_ids + output_ids if ran_ahead else (prompt_ids + output_ids)[:-1]
                self._cache.insert(kept, namespace)
            self._metrics["prompt_tokens"] += n_prompt
            self._metrics["generation_tokens"] += len(output_ids)
            self._metrics["success_" + finish] += 1
            self.served_requests += 1
        reasoning_text: Optional[str] = None
        content_text = text
        reasoning_tokens = 0
        parsed_reasoning_tokens = 0
        if cfg.reasoning:
            reasoning_text, content_text = split_reasoning(text)
            # SGLang's scheduler counts output tokens up to and including the think-end token sequence, or
            # all of them while it has not come (Req.update_reasoning_tokens, srt/managers/schedule_batch.py:
            # 2240-2259; the self-opened variant adds the <think> start tokens, :2261-2283): the tokens of
            # the "<think>...</think>" part.
            end = text.find(THINK_END)
            reasoning_tokens = len(tokenize(text[: end + len(THINK_END)])) if end >= 0 else len(output_ids)
            # vLLM counts the tokens of the parser's reasoning chunks, the text between the markers
            # (ParserEngine.count_reasoning_tokens -> StreamingParserEngine._record_reasoning_tokens,
            # vllm/parser/engine/parser_engine.py:788-790, streaming_parser_engine.py:180-185).
            parsed_reasoning_tokens = len(tokenize(reasoning_text or ""))
        return {
            "text": text,
            "reasoning_text": reasoning_text,
            "content_text": content_text,
            "output_ids": output_ids,
            "finish_reason": finish,
            "cached_tokens": cached,
            "prompt_tokens": n_prompt,
            "diverged": diverged,
            "reasoning_tokens": reasoning_tokens if not self._vllm else parsed_reasoning_tokens,
        }

    def _usage(self, result: Dict[str, Any], chat: bool = True) -> Dict[str, Any]:
        """The usage object. ``completion_tokens`` counts every output token, reasoning included."""
        cfg = self.config
        prompt = result["prompt_tokens"]
        completion = len(result["output_ids"])
        cached = result["cached_tokens"]
        if self._vllm:
            # vLLM 0.32.0 also reports created_cache_tokens (the prompt's full blocks this request wrote to
            # the cache: a 292-token prompt with 256 cached, block 32, gave 32) and multimodal_tokens (null)
            created = prompt // cfg.block_size * cfg.block_size - cached if cfg.prefix_caching else 0
            details = (
                {"cached_tokens": cached, "created_cache_tokens": max(created, 0), "multimodal_tokens": None}
                if cfg.report_cached_tokens
                else None
            )
            usage: Dict[str, Any] = {
                "prompt_tokens": prompt,
                "total_tokens": prompt + completion,
                "completion_tokens": completion,
                "prompt_tokens_details": details,
            }
            if chat:
                usage["completion_tokens_details"] = None
            if cfg.reasoning and chat:
                # With a reasoning parser, chat usage carries completion_tokens_details.reasoning_tokens
                # (vllm/entrypoints/openai/chat_completion/serving.py:166, :1110-1122).
                usage["completion_tokens_details"] = {"reasoning_tokens": result["reasoning_tokens"]}
            return usage
        details = {"cached_tokens": cached} if cfg.report_cached_tokens else None
        if cfg.null_details_on_miss and not cached:  # older SGLang's UsageProcessor._details_if_cached
            details = None
        usage = {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": details,
            "reasoning_tokens": result["reasoning_tokens"],
            # null unless there are reasoning tokens (srt/entrypoints/openai/usage_processor.py:127-131)
            "completion_tokens_details": (
                {"reasoning_tokens": result["reasoning_tokens"]} if result["reasoning_tokens"] else None
            ),
        }
        return usage

    @staticmethod
    def _logprob_content(prompt_text: str, output_ids: List[int], k: int) -> List[Dict[str, Any]]:
        seed = hashlib.sha256(b"logprobs\x00" + prompt_text.encode("utf-8")).digest()
        pool = "etaoinshrdlcumwfgypbvkjxqz ,."
        content = []
        for i, tid in enumerate(output_ids):
            d = hashlib.sha256(seed + i.to_bytes(4, "big")).digest()
            tok = token_str(tid)
            chosen = -round(0.0001 + (int.from_bytes(d[:2], "big") % 2000) / 10000.0, 6)
            alts = [c for c in pool if c != tok]
            start = d[2] % len(alts)
            top = [{"token": tok, "logprob": chosen, "bytes": list(tok.encode("utf-8"))}]
            for j in range(max(k - 1, 0)):
                alt = alts[(start + j) % len(alts)]
                lp = round(chosen - 1.0 - 0.75 * j - (d[3 + (j % 20)] % 50) / 1000.0, 6)
                top.append({"token": alt, "logprob": lp, "bytes": list(alt.encode("utf-8"))})
            content.append(
                {"token": tok, "logprob": chosen, "bytes": list(tok.encode("utf-8")), "top_logprobs": top[:k]}
            )
        return content

    def _chat(self, body: Dict[str, Any]) -> Tuple[Dict[str, Any], Optional[List[Dict[str, Any]]]]:
        messages = body.get("messages")
        if messages is None:
            raise self._validation_error("Field required", "messages", "missing")
        if not isinstance(messages, list):
            raise self._validation_error("Input should be a valid list", "messages")
        if not messages:
            if self._vllm:
                raise _RequestError(
                    400,
                    "Cannot apply chat template to an empty conversation. Provide at least one message.",
                    "BadRequestError",
                )
            raise _RequestError(400, "Messages cannot be empty.", "BadRequestError")
        namespace = self._namespace(body)
        model = self._check_model(body)
        self._check_n(body)
        k = self._logprobs_k(body)
        try:
            prompt_text = render_chat(
                messages, bool(body.get("add_generation_prompt", True)), self.config.chat_template
            )
        except ValueError as exc:
            raise self._validation_error(str(exc), "messages") from None
        prompt_ids = tokenize(prompt_text)
        max_tokens = self._max_tokens(body, len(prompt_ids))
        tools = body.get("tools") if isinstance(body.get("tools"), list) else None
        result = self._generate(prompt_ids, prompt_text, namespace, messages, max_tokens, tools,
                                body.get("tool_choice"))
        reasoning, answer, keep_logprobs = self._message_fields(body, result)
        tool_calls = None
        if tools and answer and answer.startswith("<tool_call>\n") and answer.endswith("\n</tool_call>"):
            call = json.loads(answer[len("<tool_call>\n"):-len("\n</tool_call>")])
            tool_calls = [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                           "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}]
            answer = None
            result["finish_reason"] = "tool_calls"

        logprobs = (
            {"content": self._logprob_content(prompt_text, result["output_ids"], k)}
            if k is not None and keep_logprobs
            else None
        )
        usage = self._usage(result)
        created = int(time.time())
        if self._vllm:
            rid = f"chatcmpl-{uuid.uuid4().hex}"
            message: Dict[str, Any] = {
                "role": "assistant",
                "content": answer,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "reasoning": reasoning,
            }
        else:
            rid = uuid.uuid4().hex
            message = {"role": "assistant", "content": answer, "reasoning_content": reasoning}
        if tool_calls:
            message["tool_calls"] = tool_calls
        choice: Dict[str, Any] = {
            "index": 0, "message": message, "logprobs": logprobs, "finish_reason": result["finish_reason"]
        }
        response: Dict[str, Any] = {
            "id": rid, "object": "chat.completion", "created": created, "model": model, "choices": [choice]
        }
        if self._vllm:
            choice.update({"stop_reason": None, "token_ids": None, "routed_experts": None})
            response.update({
                "service_tier": None,
                "system_fingerprint": f"vllm-{self.config.version}-{self._fingerprint}",
                "usage": usage,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "prompt_text": None,
                "kv_transfer_params": None,
                "ec_transfer_params": None,
                "metrics": None,
            })
        else:
            choice["matched_stop"] = EOS_TOKEN_ID if result["finish_reason"] == "stop" else None
            response.update({"usage": usage, "metadata": None})
        if not body.get("stream"):
            return response, None
        return response, self._stream_chunks(body, response, result, logprobs)

    def _message_fields(
        self, body: Dict[str, Any], result: Dict[str, Any]
    ) -> Tuple[Optional[str], Optional[str], bool]:
        """(reasoning, content, keep logprobs) of the chat message, as the server's reasoning parser gives them.

        vLLM 0.34: ``message.reasoning`` and ``content`` from the parser, each None when empty
        (chat_completion/protocol.py:76-88; parser_engine.py:794-835); ``include_reasoning: false`` drops the
        reasoning and the logprobs (protocol.py:281; chat_completion/serving.py:1026-1035,
        message_assembly.py:53-54). SGLang 0.5.23: ``message.reasoning_content`` (None when empty) and
        ``content`` ("" when empty) unless ``separate_reasoning: false``, which leaves the whole output in
        ``content`` (protocol.py:1018; serving_chat.py:2929-2950, :2994-3004)."""
        if not self.config.reasoning:
            return None, result["text"], True
        reasoning, content = result["reasoning_text"], result["content_text"]
        if self._vllm:
            if body.get("include_reasoning", True) is False:
                return None, content or None, False
            return reasoning or None, content or None, True
        if body.get("separate_reasoning", True) is False:
            return None, result["text"], True
        return reasoning or None, content, True

    def _stream_chunks(
        self,
        body: Dict[str, Any],
        response: Dict[str, Any],
        result: Dict[str, Any],
        logprobs: Optional[Dict[str, Any]],
    ) -> List[Dict[str, Any]]:
        base = {
            "id": response["id"],
            "object": "chat.completion.chunk",
            "created": response["created"],
            "model": response["model"],
        }
        chunks: List[Dict[str, Any]] = [
            dict(
                base,
                choices=[
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            )
        ]
        step = 8
        lp_content = (logprobs or {}).get("content") or []
        cursor = 0  # logprob entries already sent: a piece carries those of the tokens up to its end
        for key, text, offset in self._stream_segments(response, result):
            for start in range(0, len(text), step):
                end = offset + min(start + step, len(text))  # one token per character of the output text
                piece_lp = {"content": lp_content[cursor:end]} if logprobs is not None else None
                cursor = end
                chunks.append(
                    dict(
                        base,
                        choices=[
                            {
                                "index": 0,
                                "delta": {key: text[start : start + step]},
                                "logprobs": piece_lp,
                                "finish_reason": None,
                            }
                        ],
                    )
                )
        chunks.append(
            dict(
                base,
                choices=[
                    {"index": 0, "delta": {}, "logprobs": None, "finish_reason": result["finish_reason"]}
                ],
            )
        )
        options = body.get("stream_options") or {}
        if isinstance(options, dict) and options.get("include_usage"):
            chunks.append(dict(base, choices=[], usage=response["usage"]))
        return chunks

    def _stream_segments(
        self, response: Dict[str, Any], result: Dict[str, Any]
    ) -> List[Tuple[str, str, int]]:
        """(delta key, text, offset of its first token in the output) for each streamed part of the message:
        the reasoning (vLLM ``delta.reasoning``, SGLang ``delta.reasoning_content``), then the content."""
        message = response["choices"][0]["message"]
        text = result["text"]
        reasoning_key = "reasoning" if self._vllm else "reasoning_content"
        reasoning = message.get(reasoning_key)
        content = message.get("content") or ""
        if not self.config.reasoning or content == text:
            return [("content", content, 0)]
        segments: List[Tuple[str, str, int]] = []
        if reasoning:
            segments.append((reasoning_key, reasoning, len(THINK_START) if text.startswith(THINK_START) else 0))
        if content:
            segments.append(("content", content, text.index(THINK_END) + len(THINK_END)))
        return segments

    def _completion(self, body: Dict[str, Any]) -> Tuple[Dict[str, Any], Optional[List[Dict[str, Any]]]]:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt_text = prompt
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt_text = detokenize(prompt)
        elif prompt is None:
            raise self._validation_error("Field required", "prompt")
        else:
            raise _RequestError(
                400,
                "the emulator accepts one prompt (a string or a list of token ids)",
                "BadRequestError",
                "prompt",
            )
        if body.get("stream"):
            raise _RequestError(
                400, "the emulator does not stream /v1/completions", "BadRequestError", "stream"
            )
        if body.get("logprobs") is not None:
            raise _RequestError(
                400, "the emulator does not return /v1/completions logprobs", "BadRequestError", "logprobs"
            )
        namespace = self._namespace(body)
        model = self._check_model(body)
        self._check_n(body)
        prompt_ids = tokenize(prompt_text)
        max_tokens = body.get("max_tokens", 16)  # the OpenAI completions default
        if max_tokens is None:
            body_for_limits = {k: v for k, v in body.items() if k != "max_tokens"}
        else:
            body_for_limits = dict(body, max_tokens=max_tokens)
        max_tokens = self._max_tokens(body_for_limits, len(prompt_ids))
        result = self._generate(
            prompt_ids, prompt_text, namespace, [{"role": "prompt", "content": prompt_text}], max_tokens
        )
        choice: Dict[str, Any] = {
            "index": 0,
            "text": result["text"],
            "logprobs": None,
            "finish_reason": result["finish_reason"],
        }
        if self._vllm:
            choice.update(
                {"stop_reason": None, "prompt_logprobs": None, "prompt_token_ids": None, "token_ids": None}
            )
            rid = f"cmpl-{uuid.uuid4().hex}"
        else:
            choice["matched_stop"] = EOS_TOKEN_ID if result["finish_reason"] == "stop" else None
            rid = uuid.uuid4().hex
        response = {
            "id": rid,
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": self._usage(result, chat=False),
        }
        return response, None

