"""The emulated model: tokenizer, ChatML rendering (and Qwen3-like variants), greedy deterministic
generation (answers, reasoning, tool calls, cache-induced divergence) and the block-hashed prefix cache.

Nothing here knows about HTTP or a server kind: the same tokens, answers and cache hits serve the vLLM and
the SGLang emulations, and the tests compute what a server must answer with these functions.
"""

from __future__ import annotations

import array
import hashlib
import json
from collections import OrderedDict
from typing import Any, Dict, Iterable, List, Optional, Tuple

# ------------------------------------------------------------------------------------------------------------
# Tokenizer and chat template
# ------------------------------------------------------------------------------------------------------------

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
# Ids above the Unicode range so they never collide with a code point (ordinary characters use ord(c)).
SPECIAL_TOKENS: Dict[str, int] = {IM_START: 0x110000, IM_END: 0x110001, ENDOFTEXT: 0x110002}
SPECIAL_BY_ID: Dict[int, str] = {v: k for k, v in SPECIAL_TOKENS.items()}
EOS_TOKEN_ID = SPECIAL_TOKENS[IM_END]
# Qwen3's reasoning markers. They are ordinary text to this tokenizer (one token per code point), unlike
# Qwen3's own, where each is one added token; nothing here depends on that.
THINK_START = "<think>"
THINK_END = "</think>"
#: ``EmulatorConfig.chat_template`` values: plain ChatML; Qwen3's template, which renders a past assistant
#: turn with only what follows its last ``</think>``; Qwen3's template with ``enable_thinking: false``,
#: whose generation prompt ends with an empty think block that past turns are not rendered with.
CHAT_TEMPLATES = ("chatml", "drop-reasoning", "empty-think-prompt")
EMPTY_THINK_BLOCK = f"{THINK_START}\n\n{THINK_END}\n\n"


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
            else:
                raise ValueError("only text content parts are supported")
        return "".join(parts)
    raise ValueError("message content must be a string or a list of text parts")


def render_chat(
    messages: Iterable[Dict[str, Any]], add_generation_prompt: bool = True, template: str = "chatml"
) -> str:
    """ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, then the generation prompt
    ``<|im_start|>assistant\\n``.

    ``template`` (one of :data:`CHAT_TEMPLATES`) models Qwen3's template:

    * ``"drop-reasoning"``: an assistant message whose content contains ``</think>`` is rendered with only
      ``content.split("</think>")[-1].lstrip("\\n")`` (Qwen3's template does so for every assistant turn
      before the last user message; here it is done for every assistant message);
    * ``"empty-think-prompt"``: the generation prompt is ``<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n``
      (Qwen3 with ``enable_thinking: false``) while past assistant turns are plain ChatML, so a turn-2
      prompt does not start with its turn-1 prompt.
    """
    if template not in CHAT_TEMPLATES:
        raise ValueError(f"chat template must be one of {', '.join(CHAT_TEMPLATES)}, not {template!r}")
    out = []
    for msg in messages:
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise ValueError("each message must be an object with a string 'role'")
        text = _content_text(msg.get("content"))
        if template == "drop-reasoning" and msg["role"] == "assistant" and THINK_END in text:
            text = text.split(THINK_END)[-1].lstrip("\n")
        for call in msg.get("tool_calls") or []:  # Hermes style, as the model generated it
            fn = call.get("function") or {} if isinstance(call, dict) else {}
            text += tool_call_text(str(fn.get("name")), str(fn.get("arguments")))
        out.append(f"{IM_START}{msg['role']}\n{text}{IM_END}\n")
    if add_generation_prompt:
        out.append(f"{IM_START}assistant\n")
        if template == "empty-think-prompt":
            out.append(EMPTY_THINK_BLOCK)
    return "".join(out)


def tokenize(text: str) -> List[int]:
    """Special markers are one token each; every other code point is one token (its ``ord``)."""
    ids: List[int] = []
    i = 0
    n = len(text)
    while i < n:
        if text[i] == "<" and text.startswith("<|", i):
            for marker, tid in SPECIAL_TOKENS.items():
                if text.startswith(marker, i):
                    ids.append(tid)
                    i += len(marker)
                    break
            else:
                ids.append(ord(text[i]))
                i += 1
        else:
            ids.append(ord(text[i]))
            i += 1
    return ids


def token_str(tid: int) -> str:
    return SPECIAL_BY_ID.get(tid) or chr(tid)


def detokenize(ids: Iterable[int]) -> str:
    return "".join(token_str(t) for t in ids)


# ------------------------------------------------------------------------------------------------------------
# Deterministic "greedy" generation
# ------------------------------------------------------------------------------------------------------------

_WORDS: Tuple[str, ...] = tuple(
    "apple river stone cloud amber quiet lantern maple orbit pepper harbor velvet meadow copper "
    "signal window garden silver candle forest marble ocean pencil rocket saddle thunder violet "
    "walnut yellow zephyr basket circle dragon engine falcon glacier hollow island jigsaw kettle "
    "ladder mirror needle oyster pillow quartz ribbon shadow tunnel umbrella valley wander canyon "
    "blossom cobalt desert ember fable granite horizon ivory juniper".split()
)
# Words used after a cache-induced divergence: disjoint from _WORDS so the two answers part visibly.
_ALT_WORDS: Tuple[str, ...] = tuple(
    "nebula trellis quiver sprocket lattice gossamer tundra bramble cinder drizzle fjord gizmo "
    "hammock inkwell jubilee kayak lagoon mosaic nugget outpost".split()
)
DIVERGE_AFTER_CHARS = 40


def _words(seed: bytes, words: Tuple[str, ...], length: int) -> str:
    """At least ``length`` characters of words from ``words``, picked by hashing ``seed``."""
    out: List[str] = []
    size = -1
    counter = 0
    digest = b""
    while size < length:
        if counter % 16 == 0:
            digest = hashlib.sha256(seed + counter.to_bytes(4, "big")).digest()
        word = words[digest[(counter % 16) * 2] % len(words)]
        out.append(word)
        size += len(word) + 1
        counter += 1
    return " ".join(out)


def _fit(text: str, length: int) -> str:
    """Cut to exactly ``length`` characters, never ending on a space."""
    text = text[:length]
    return text[:-1] + "e" if text.endswith(" ") else text


def tool_call_text(name: str, arguments: str) -> str:
    """A tool call as the emulated model writes it (and the template renders it back)."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def generate_tool_call(prompt_text: str, tools: List[Dict[str, Any]], choice: Any, flip: bool = False) -> str:
    """The greedy tool call for a rendered prompt when a call is required: the named (or first) tool,
    its first parameter set to a word chosen by the prompt's sha256 (another word when ``flip``)."""
    name = choice["function"]["name"] if isinstance(choice, dict) else tools[0]["function"]["name"]
    fn = next((t["function"] for t in tools if t["function"]["name"] == name), tools[0]["function"])
    props = list(((fn.get("parameters") or {}).get("properties") or {"input": {}}).keys()) or ["input"]
    digest = hashlib.sha256(prompt_text.encode("utf-8")).digest()
    word = _WORDS[(digest[0] + (7 if flip else 0)) % len(_WORDS)]
    return tool_call_text(name, json.dumps({props[0]: word}))


def generate_answer(prompt_text: str) -> str:
    """The greedy answer to a rendered prompt: 150-400 characters of lowercase words, from its sha256."""
    digest = hashlib.sha256(prompt_text.encode("utf-8")).digest()
    length = 150 + int.from_bytes(digest[:4], "big") % 251
    return _fit(_words(digest, _WORDS, length), length)


def generate_reasoning(prompt_text: str) -> str:
    """The greedy "thinking" for a rendered prompt (``reasoning=True``): 60-120 characters of lowercase
    words, from a sha256 of the prompt."""
    digest = hashlib.sha256(b"reasoning\x00" + prompt_text.encode("utf-8")).digest()
    length = 60 + int.from_bytes(digest[:4], "big") % 61
    return _fit(_words(digest, _WORDS, length), length)


def thinking_output(reasoning: str, answer: str) -> str:
    """A thinking model's output text (before EOS), Qwen3's shape: ``<think>\\n{R}\\n</think>\\n\\n{answer}``."""
    return f"{THINK_START}\n{reasoning}\n{THINK_END}\n\n{answer}"


def split_reasoning(text: str) -> Tuple[Optional[str], str]:
    """(reasoning, content) of a thinking model's output text, as the Qwen3 reasoning parsers split it.

    Both servers cut at the first ``</think>`` and strip nothing: the reasoning is the text between the
    leading ``<think>`` and ``</think>`` (``"\\n" + R + "\\n"`` here), the content everything after
    ``</think>`` (``"\\n\\n" + answer``), so ``"<think>" + reasoning + "</think>" + content`` is the output
    again (SGLang 0.5.23 ``BaseReasoningFormatDetector._detect_and_parse_impl``,
    srt/parser/reasoning_parser.py:163-201; vLLM 0.34 ``ParserEngine._single_pass_parse`` with
    ``strip_trailing_reasoning_whitespace=False`` for qwen3, vllm/parser/engine/parser_engine.py:794-835,
    vllm/parser/qwen3.py:328). Output cut by ``max_tokens`` before ``</think>`` is all reasoning (SGLang:
    "Assume reasoning was truncated before end token", reasoning_parser.py:188-191) and the content is empty;
    a partial marker is kept as text (kept simple: the real parsers may hold a partial ``</think>`` back).
    """
    body = text[len(THINK_START) :] if text.startswith(THINK_START) else text
    if THINK_END not in body:
        return body, ""
    reasoning, content = body.split(THINK_END, 1)
    return reasoning, content


def diverged_answer(prompt_text: str, original: str) -> str:
    """The answer on a cache hit when the diverge knob fires: the same first 40 characters, then other words.

    It has the same length as ``original`` and differs from it exactly at character 40."""
    seed = hashlib.sha256(b"diverge\x00" + prompt_text.encode("utf-8")).digest()
    keep = original[:DIVERGE_AFTER_CHARS]
    rest = _words(seed, _ALT_WORDS, len(original))
    if rest[:1] == original[len(keep) : len(keep) + 1]:  # same first letter by chance: part at once anyway
        rest = "x" + rest
    return _fit(keep + rest, len(original))


def expected_cached_tokens(lcp: int, n_prompt: int, block_size: int) -> int:
    """``floor(min(LCP, n_prompt - 1) / G) * G``: what a vLLM/SGLang request can hit."""
    usable = max(min(lcp, n_prompt - 1), 0)
    return (usable // block_size) * block_size


# ------------------------------------------------------------------------------------------------------------
# Prefix cache: chained block hashes, salt in the first block
# ------------------------------------------------------------------------------------------------------------


class PrefixCache:
    """Full blocks of ``block_size`` tokens keyed by a chained hash; the namespace (salt) enters block 0."""

    def __init__(self, block_size: int, capacity_blocks: int = 200_000) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self.block_size = block_size
        self.capacity = capacity_blocks
        self._blocks: "OrderedDict[bytes, None]" = OrderedDict()

    def _hashes(self, tokens: List[int], namespace: Optional[str], limit: int) -> Iterable[bytes]:
        g = self.block_size
        parent = b"root"
        for start in range(0, (limit // g) * g, g):
            h = hashlib.sha256(parent)
            if start == 0 and namespace is not None:
                h.update(b"\x00salt\x00" + namespace.encode("utf-8") + b"\x00")
            h.update(array.array("I", tokens[start : start + g]).tobytes())
            parent = h.digest()
            yield parent

    def lookup(self, tokens: List[int], namespace: Optional[str], max_tokens: int) -> int:
        """Leading full blocks found, within the first ``max_tokens`` tokens."""
        hit = 0
        for digest in self._hashes(tokens, namespace, min(max_tokens, len(tokens))):
            if digest not in self._blocks:
                break
            self._blocks.move_to_end(digest)
            hit += self.block_size
        return hit

    def insert(self, tokens: List[int], namespace: Optional[str]) -> None:
        for digest in self._hashes(tokens, namespace, len(tokens)):
            self._blocks[digest] = None
            self._blocks.move_to_end(digest)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()

    def __len__(self) -> int:
        return len(self._blocks)
