"""Write tiny random-weight GGUF models that llama-server can serve in the end-to-end tests.

The model is a 2-layer ``qwen2`` transformer (embedding width 128, 4 query heads, 2 KV heads of
width 32, FFN 256, context 4096) that reuses the complete tokenizer (every ``tokenizer.*`` entry,
including ``tokenizer.chat_template``) of llama.cpp's ``models/ggml-vocab-qwen2.gguf``.

Its weights are random but shaped so that greedy answers are usable for prompt-cache checks:

* ``output.bias`` gives every token a hugely negative logit except a set of whole lowercase words
  (a leading space ``Ġ`` plus 2-8 ASCII letters, e.g. ``" house"``, each verified to be its own BPE
  encoding) and the end-of-turn token ``<|im_end|>``.  An answer is therefore text like
  ``" pen river stone"`` that re-tokenizes to exactly the generated tokens, so a turn-2 prompt that
  replays the answer can reuse the KV cache all the way through it.
* The output rows are anti-aligned with the token embeddings, which discourages repeating recent
  words, and ``<|im_end|>`` has a tuned bias so that many answers stop well before 256 tokens.

Greedy margins are small (median top-1/top-2 gap about 0.8-0.9 nats), so numeric differences
between a cached and an uncached prompt evaluation do flip some answers: with llama-server 11434.0.0
on CPU, turn-2 answers with vs without the turn-1 cache differed in 10/20 conversations for q4_0,
4/20 for q8_0, 1/20 for f32 and 0/20 for f16 (deterministically; see
tests/support/LLAMA_FINDINGS.md).  ``TinyModelConfig.n_words`` makes the word set smaller.

Tool calls (:func:`tool_model_config`, all options off by default): ``<tool_call>``/``</tool_call>``
become single tokens, the tokens of the tool-call JSON (:func:`tool_call_texts`) may be emitted with low
biases, and a bigram term in the output rows makes each of them predict the one that follows it there.
Served by llama-server with ``--jinja`` and Qwen2.5's chat template, ``tool_choice`` "auto"/"required"
then yields real ``tool_calls`` (llama-server's grammar picks among the allowed tokens) that re-render
to the generated tokens (tests/support/TOOLCALL_FINDINGS.md).

Everything is derived from ``seed`` with numpy's PCG64 generator, so the same arguments always give
byte-identical files.  Writing a model takes about 3-5 s (f32 file 163 MB, f16 85 MB, q8_0 48 MB,
q4_0 29 MB; most of it is the 151936 x 128 ``token_embd`` and ``output`` matrices).
Requires the ``gguf`` and ``numpy`` packages (the ``test``/``demo`` extras).
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO, Dict, List, Optional, Sequence, Tuple

import numpy as np

FTYPES: Tuple[str, ...] = ("f32", "f16", "q8_0", "q4_0")
"""Supported values of ``ftype``."""

ALLOWED_WORD_PATTERN = re.compile("^\u0120[a-z]{2,8}$")
"""Byte-level BPE spelling of the word tokens the model may emit (``Ġ`` is the encoded space)."""

END_OF_TURN = "<|im_end|>"
TOOL_CALL_MARKERS: Tuple[Tuple[int, str], ...] = ((151657, "<tool_call>"), (151658, "</tool_call>"))
"""Where ``TinyModelConfig.tool_call_tokens`` puts the markers (the ids Qwen2.5's vocabulary uses)."""

# the qwen2 pre-tokenizer regex restricted to ASCII (\p{L} -> [A-Za-z], \p{N} -> [0-9])
_ASCII_PRETOKENIZE = re.compile(
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]"
    r"| ?[^\sA-Za-z0-9]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class TinyModelConfig:
    """Hyper-parameters of the tiny qwen2 model."""

    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 256
    n_ctx: int = 4096
    rope_freq_base: float = 10000.0
    rms_eps: float = 1e-6
    # weight shaping (see module docstring)
    logit_scale: float = 4.0
    """Standard deviation of the allowed tokens' logits before the anti-repetition term."""
    anti_repeat: float = 3.0
    """How strongly output rows point away from their own token embedding."""
    end_bias: float = 9.0
    """Extra logit of ``<|im_end|>``; higher means shorter answers."""
    attn_gain: float = 2.0
    """Scale of the query/key projections; higher means sharper, more position-dependent attention."""
    disallowed_logit: float = -10000.0
    """Bias of every token that is not an allowed word or ``<|im_end|>``."""
    n_words: int = 0
    """Use only this many of the allowed words (a seeded random subset); 0 means all of them."""
    # tool calls (all off by default; the default model does not change)
    tool_call_tokens: bool = False
    """Rename two unused tokens to ``<tool_call>`` and ``</tool_call>`` (ids 151657/151658, where
    Qwen2.5's vocabulary has them) so that a tools chat template's markers are single tokens, and let
    the model emit them."""
    tool_call_bias: float = 0.0
    """Extra logit of ``<tool_call>``; higher means the model opens a tool call more often."""
    tool_call_end_bias: float = 0.0
    """Extra logit of ``</tool_call>`` (where the grammar requires it, it is the only choice; inside a JSON
    string, where it is allowed text, a low bias keeps it out)."""
    tool_call_start_gain: float = 0.0
    """Added to ``<tool_call>``'s output row along the unit embedding of ``\n``: right after the generation
    prompt ``<|im_start|>assistant\n`` it outranks every word by about 5 times this minus
    ``-tool_call_bias``, so an answer to a request with tools starts with a call (with "required" and
    "auto" alike); elsewhere (inside a JSON string, where the marker is allowed text) it loses."""
    extra_texts: Tuple[str, ...] = ()
    """ASCII texts (e.g. a rendered tool call) whose tokens the model may emit besides the words, so
    that a grammar (tool calls, JSON) can produce them as the tokens the text re-tokenizes to."""
    extra_bias: float = 0.0
    """Extra logit of the tokens of ``extra_texts`` that are not words already."""
    extra_piece_bias: float = 0.0
    """Added to ``extra_bias`` for those of them made only of letters, digits and ``_`` (pieces of
    keys, names and numbers, like ``_weather``), so that they lose to the other extra tokens where
    both fit, e.g. where a JSON string may either go on or close."""
    extra_space_bias: float = 0.0
    """Added to ``extra_bias`` for those of them made only of whitespace, so that where a grammar
    allows optional whitespace the punctuation the texts continue with wins."""
    follow_gain: float = 0.0
    """How strongly a token of ``extra_texts`` predicts the tokens that follow it there (a bigram
    model): for each pair (a, b) of neighbours in a text, b's output row gets ``follow_gain`` times
    the unit embedding of a added (the ``anti_repeat`` mechanism with the opposite sign), which
    raises b's logit by about ``follow_gain`` times 5 when a is the current token (about 11 for a
    marker with ``marker_embd_scale`` 4), and moves it by about ``follow_gain`` (standard deviation)
    elsewhere."""
    marker_follow_gain: float = 0.0
    """``follow_gain`` for the pairs whose first token is ``<tool_call>`` or ``</tool_call>``."""
    marker_embd_scale: float = 1.0
    """Scale of the embeddings of the tool-call markers: larger makes the marker dominate the last
    hidden state right after it, so ``marker_follow_gain`` acts there more sharply than elsewhere."""
    string_closers: bool = False
    """The first token of each text of ``extra_texts`` that starts with ``"`` (``",``, ``"}}\\n``: what
    follows a free string value) gets ``<|im_end|>``'s output row and its bias minus ``closer_gap``, so
    that a grammar-constrained string ends where an answer would end, while in free text, where
    ``<|im_end|>`` is allowed, a closer never wins."""
    closer_gap: float = 0.5
    closer_after_colon: float = 0.0
    """Subtracted from the closers' output rows along the embeddings of the tokens that precede an
    opening quote ``Ġ"`` in ``extra_texts`` (``":``): a free string may start with ``",``, and there the
    closer would otherwise win over ``Ġ"`` (the template renders ``": "``)."""
    open_quote_gain: float = 0.0
    """Added to every word's output row along the embedding of ``Ġ"`` (the token that opens a string
    value): right after it the words outrank ``<|im_end|>`` and the closers by about 5 times this, so a
    string is not closed as soon as it opens (`` ""`` would re-tokenize as one token)."""
    twin_gain: float = 0.0
    """First-word twins: each word ``Ġabc`` whose ``abc`` is a token of its own gets a twin ``abc`` with
    the word's output row plus ``twin_gain`` times the unit embedding of ``\\n`` and a bias of
    ``-twin_offset``: right after ``\\n`` (the end of the generation prompt ``<|im_start|>assistant\\n``)
    the twin outranks its word, elsewhere it loses to it. An answer then starts without a space, which
    llama-server would strip from the content of a reply to a request with tools (so the re-rendered
    answer would be other tokens than those generated)."""
    twin_offset: float = 0.0

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


WORDS_PATTERN = "^( [a-z]{2,8}){1,3}$"
"""JSON-schema ``pattern`` for string arguments of the tool-call model: one to three of its words. A
grammar-constrained string then ends by itself after the third word (a plain string only ends at
``max_tokens``, and ``maxLength`` ends words in the middle, with pieces that re-tokenize differently)."""

DEMO_TOOLS: Tuple[Dict[str, Any], ...] = (
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "pattern": WORDS_PATTERN}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "book_table", "description": "Book a table",
        "parameters": {"type": "object", "properties": {
            "name": {"type": "string", "pattern": WORDS_PATTERN},
            "guests": {"type": "integer", "minimum": 1, "maximum": 20},
            "time": {"type": "string", "enum": ["lunch", "dinner"]}},
            "required": ["name", "guests", "time"]}}},
)
"""OpenAI tool definitions (a string; a string, an integer and an enum) the tool-call model knows."""

_FREE_STRING = "@@free@@"


def tool_call_texts(tools: Sequence[Dict[str, Any]]) -> Tuple[str, ...]:
    """``extra_texts`` for tool calls to ``tools`` (OpenAI tool definitions) as Qwen2.5's chat template
    renders them (``<tool_call>`` + JSON with ``", "``/``": "`` separators + ``</tool_call>``), cut at
    every free string value (the model writes its words there), plus the ten digits.  Properties may
    be strings (free or ``enum``), integers, numbers or booleans; they are written in schema order."""
    texts: List[str] = []
    for tool in tools:
        fn = tool.get("function", {})
        name, props = fn.get("name"), fn.get("parameters", {}).get("properties", {})
        if not isinstance(name, str) or not name.isascii() or not isinstance(props, dict):
            raise ValueError("tool_call_texts: tool %r needs an ASCII function name and properties" % (tool,))
        enums = [len(p["enum"]) for p in props.values() if isinstance(p, dict) and "enum" in p]
        for k in range(max([2] + enums)):
            args: Dict[str, Any] = {}
            for key, prop in props.items():
                kind = prop.get("type") if isinstance(prop, dict) else None
                if isinstance(prop, dict) and "enum" in prop:
                    args[key] = prop["enum"][k % len(prop["enum"])]
                elif kind == "string":
                    args[key] = _FREE_STRING
                elif kind in ("integer", "number"):
                    args[key] = 2 * k + 2
                elif kind == "boolean":
                    args[key] = k % 2 == 0
                else:
                    raise ValueError("tool_call_texts: %s.%s has type %r; only strings, integers, numbers "
                                     "and booleans are supported" % (name, key, kind))
            call = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
            texts.extend(("\n<tool_call>\n%s\n</tool_call>%s" % (call, END_OF_TURN)).split(_FREE_STRING))
    return tuple(dict.fromkeys(texts)) + tuple("0123456789")


def tool_model_config(tools: Sequence[Dict[str, Any]] = DEMO_TOOLS, **overrides: Any) -> TinyModelConfig:
    """A :class:`TinyModelConfig` whose model calls ``tools`` through llama-server's grammar with
    Qwen2.5's chat template (``--jinja --chat-template-file``), so that the calls re-render to the
    tokens it generated; see tests/support/TOOLCALL_FINDINGS.md for what it does and how it was tuned."""
    cfg = TinyModelConfig(tool_call_tokens=True, extra_texts=tool_call_texts(tools),
                          extra_bias=-40.0, extra_piece_bias=0.0, extra_space_bias=-36.0, follow_gain=14.0,
                          marker_follow_gain=14.0, marker_embd_scale=4.0, string_closers=True,
                          open_quote_gain=4.0, twin_gain=4.0, twin_offset=14.0, tool_call_bias=-35.0,
                          tool_call_end_bias=-30.0, tool_call_start_gain=12.0, closer_after_colon=5.0)
    return replace(cfg, **overrides)


# ---------------------------------------------------------------------------------------------
# minimal GGUF metadata reader (gguf.GGUFReader needs ~10-20 s for a 150k-token vocabulary)
# ---------------------------------------------------------------------------------------------

_SCALAR_FORMATS: Dict[int, str] = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d",
}
_NUMPY_DTYPES: Dict[int, str] = {
    0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
    12: "<f8",
}
_STRING = 8
_ARRAY = 9


@dataclass(frozen=True)
class GGUFValue:
    """A metadata value: its GGUF value type, element type for arrays, and the Python value."""

    vtype: int
    value: Any
    sub_type: Optional[int] = None


def _read_exact(fh: BinaryIO, n: int) -> bytes:
    data = fh.read(n)
    if len(data) != n:
        raise ValueError("truncated GGUF file")
    return data


def _read_string(fh: BinaryIO) -> str:
    (n,) = struct.unpack("<Q", _read_exact(fh, 8))
    return _read_exact(fh, n).decode("utf-8")


def _read_value(fh: BinaryIO, vtype: int) -> GGUFValue:
    if vtype == _STRING:
        return GGUFValue(vtype, _read_string(fh))
    if vtype == _ARRAY:
        sub, n = struct.unpack("<IQ", _read_exact(fh, 12))
        if sub == _STRING:
            return GGUFValue(vtype, [_read_string(fh) for _ in range(n)], sub)
        if sub in _NUMPY_DTYPES:
            dtype = np.dtype(_NUMPY_DTYPES[sub])
            arr = np.frombuffer(_read_exact(fh, n * dtype.itemsize), dtype=dtype)
            values: List[Any] = [bool(v) for v in arr] if sub == 7 else arr.tolist()
            return GGUFValue(vtype, values, sub)
        raise ValueError("unsupported GGUF array element type %d" % sub)
    if vtype in _SCALAR_FORMATS:
        fmt = _SCALAR_FORMATS[vtype]
        (val,) = struct.unpack(fmt, _read_exact(fh, struct.calcsize(fmt)))
        return GGUFValue(vtype, val)
    raise ValueError("unsupported GGUF value type %d" % vtype)


def read_gguf_metadata(path: "os.PathLike[str] | str") -> Dict[str, GGUFValue]:
    """Read the key/value metadata of a GGUF file (version 2 or 3) without its tensors."""
    with open(str(path), "rb") as fh:
        if _read_exact(fh, 4) != b"GGUF":
            raise ValueError("%s is not a GGUF file" % path)
        (version,) = struct.unpack("<I", _read_exact(fh, 4))
        if version < 2:
            raise ValueError("GGUF version %d is not supported" % version)
        _n_tensors, n_kv = struct.unpack("<QQ", _read_exact(fh, 16))
        out: Dict[str, GGUFValue] = {}
        for _ in range(n_kv):
            key = _read_string(fh)
            (vtype,) = struct.unpack("<I", _read_exact(fh, 4))
            out[key] = _read_value(fh, vtype)
        return out


def read_gguf_tensor_infos(path: "os.PathLike[str] | str") -> Dict[str, Tuple[Tuple[int, ...], int]]:
    """Names of the tensors in a GGUF file with their shape (GGUF order, fastest first) and
    ``GGMLQuantizationType`` number."""
    with open(str(path), "rb") as fh:
        if _read_exact(fh, 4) != b"GGUF":
            raise ValueError("%s is not a GGUF file" % path)
        _version, n_tensors, n_kv = struct.unpack("<IQQ", _read_exact(fh, 20))
        for _ in range(n_kv):
            _read_string(fh)
            (vtype,) = struct.unpack("<I", _read_exact(fh, 4))
            _read_value(fh, vtype)
        infos: Dict[str, Tuple[Tuple[int, ...], int]] = {}
        for _ in range(n_tensors):
            name = _read_string(fh)
            (n_dims,) = struct.unpack("<I", _read_exact(fh, 4))
            dims = struct.unpack("<%dQ" % n_dims, _read_exact(fh, 8 * n_dims))
            ttype, _offset = struct.unpack("<IQ", _read_exact(fh, 12))
            infos[name] = (tuple(int(d) for d in dims), int(ttype))
        return infos


# ---------------------------------------------------------------------------------------------
# vocabulary analysis
# ---------------------------------------------------------------------------------------------


def _bpe(word: str, ranks: Dict[Tuple[str, str], int]) -> List[str]:
    parts = list(word)
    while len(parts) > 1:
        best_rank = -1
        best_at = -1
        for j in range(len(parts) - 1):
            rank = ranks.get((parts[j], parts[j + 1]))
            if rank is not None and (best_rank < 0 or rank < best_rank):
                best_rank, best_at = rank, j
        if best_at < 0:
            break
        parts[best_at:best_at + 2] = [parts[best_at] + parts[best_at + 1]]
    return parts


def _merge_ranks(merges: Sequence[str]) -> Dict[Tuple[str, str], int]:
    """BPE merge priorities: (left, right) -> rank, the first occurrence winning."""
    ranks: Dict[Tuple[str, str], int] = {}
    for rank, merge in enumerate(merges):
        left, _, right = merge.partition(" ")
        ranks.setdefault((left, right), rank)
    return ranks


def allowed_token_ids(tokens: Sequence[str], merges: Sequence[str]) -> List[int]:
    """Ids of whole-word tokens (``Ġ`` + 2-8 lowercase ASCII letters) that byte-level BPE maps back
    to themselves, so that a text made of them re-tokenizes to the same ids."""
    ranks = _merge_ranks(merges)
    return [i for i, tok in enumerate(tokens)
            if ALLOWED_WORD_PATTERN.match(tok) and _bpe(tok, ranks) == [tok]]


def _byte_encoder() -> Dict[int, str]:
    """GPT-2's byte -> printable character map of byte-level BPE (space is ``Ġ``, newline ``Ċ``)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + n)
            n += 1
    return out


def tokenize_ascii(text: str, tokens: Sequence[str], merges: Sequence[str],
                   specials: Sequence[str] = ()) -> List[int]:
    """Token ids of an ASCII ``text`` as llama.cpp's qwen2 tokenizer makes them (``specials`` are
    matched first, as whole tokens).  Raises ValueError for non-ASCII text or a piece not in the vocab."""
    return _tokenize(text, {tok: i for i, tok in enumerate(tokens)}, _merge_ranks(merges), specials)


def _tokenize(text: str, index: Dict[str, int], ranks: Dict[Tuple[str, str], int],
              specials: Sequence[str]) -> List[int]:
    """:func:`tokenize_ascii` with the vocabulary's index and merge ranks made once by the caller."""
    if not text.isascii():
        raise ValueError("tokenize_ascii: %r is not ASCII" % text)
    enc = _byte_encoder()
    parts = re.split("(%s)" % "|".join(re.escape(s) for s in specials), text) if specials else [text]
    ids: List[int] = []
    for part in parts:
        if part in specials:
            ids.append(index[part])
            continue
        for pre in _ASCII_PRETOKENIZE.findall(part):
            for piece in _bpe("".join(enc[b] for b in pre.encode("ascii")), ranks):
                if piece not in index:
                    raise ValueError("tokenize_ascii: piece %r of %r is not in the vocabulary"
                                     % (piece, text))
                ids.append(index[piece])
    return ids


@dataclass(frozen=True)
class TinyVocab:
    """The tokenizer metadata to copy and the ids the model may emit."""

    tokenizer_kv: Dict[str, GGUFValue]
    n_vocab: int
    allowed_ids: Tuple[int, ...]
    end_of_turn_id: int
    tool_call_ids: Tuple[int, ...] = ()
    """``<tool_call>``, ``</tool_call>`` when the vocab was loaded with ``tool_call_tokens``."""


def _with_tool_call_tokens(
    tok_kv: Dict[str, GGUFValue], path: object
) -> Tuple[Dict[str, GGUFValue], Tuple[int, ...]]:
    tokens: List[str] = list(tok_kv["tokenizer.ggml.tokens"].value)
    types = tok_kv.get("tokenizer.ggml.token_type")
    ids = []
    for tid, text in TOOL_CALL_MARKERS:
        if text in tokens:
            ids.append(tokens.index(text))
            continue
        # only an unused user-defined placeholder may be renamed
        if tid >= len(tokens) or not tokens[tid].startswith("[PAD") or types is None or types.value[tid] != 4:
            raise ValueError("%s: token %d is %r, not an unused [PAD] placeholder; cannot add %s"
                             % (path, tid, tokens[tid] if tid < len(tokens) else None, text))
        tokens[tid] = text
        ids.append(tid)
    out = dict(tok_kv)
    out["tokenizer.ggml.tokens"] = GGUFValue(_ARRAY, tokens, _STRING)
    return out, tuple(ids)


def load_vocab(vocab_gguf: "os.PathLike[str] | str", tool_call_tokens: bool = False) -> TinyVocab:
    """Read the tokenizer of a vocab GGUF and select the allowed word tokens; with ``tool_call_tokens``
    add ``<tool_call>``/``</tool_call>`` (see :attr:`TinyModelConfig.tool_call_tokens`)."""
    meta = read_gguf_metadata(vocab_gguf)
    tok_kv = {k: v for k, v in meta.items() if k.startswith("tokenizer.")}
    if "tokenizer.ggml.tokens" not in tok_kv:
        raise ValueError("%s has no tokenizer.ggml.tokens" % vocab_gguf)
    tokens: List[str] = tok_kv["tokenizer.ggml.tokens"].value
    merges: List[str] = tok_kv["tokenizer.ggml.merges"].value if "tokenizer.ggml.merges" in tok_kv else []
    allowed = allowed_token_ids(tokens, merges)
    if len(allowed) < 100:
        raise ValueError("%s has only %d whole-word tokens; a byte-level BPE vocab is needed"
                         % (vocab_gguf, len(allowed)))
    if END_OF_TURN in tokens:
        eot = tokens.index(END_OF_TURN)
    elif "tokenizer.ggml.eos_token_id" in tok_kv:
        eot = int(tok_kv["tokenizer.ggml.eos_token_id"].value)
    else:
        raise ValueError("%s has neither %s nor an EOS token" % (vocab_gguf, END_OF_TURN))
    tool_ids: Tuple[int, ...] = ()
    if tool_call_tokens:
        tok_kv, tool_ids = _with_tool_call_tokens(tok_kv, vocab_gguf)
    return TinyVocab(tok_kv, len(tokens), tuple(allowed), eot, tool_ids)


def tokenize_texts(vocab: TinyVocab, texts: Sequence[str]) -> List[List[int]]:
    """Each text's token ids (see :func:`tokenize_ascii`; ``<|im_end|>`` and the tool-call markers
    are matched as single tokens)."""
    tokens, merges = _tokens_and_merges(vocab)
    index = {tok: i for i, tok in enumerate(tokens)}
    ranks = _merge_ranks(merges)
    specials = [tokens[i] for i in vocab.tool_call_ids] + [END_OF_TURN]
    return [_tokenize(text, index, ranks, specials) for text in texts]


def _tokens_and_merges(vocab: TinyVocab) -> Tuple[List[str], List[str]]:
    kv = vocab.tokenizer_kv.get("tokenizer.ggml.merges")
    return vocab.tokenizer_kv["tokenizer.ggml.tokens"].value, (kv.value if kv is not None else [])


def extra_token_ids(vocab: TinyVocab, texts: Sequence[str],
                    tokenized: Optional[List[List[int]]] = None) -> List[int]:
    """Sorted ids of the tokens of ``texts`` (or of their ``tokenized`` ids, when the caller has them)
    other than ``<|im_end|>`` and the tool-call markers."""
    ids = {i for seq in (tokenized if tokenized is not None else tokenize_texts(vocab, texts)) for i in seq}
    return sorted(ids - {vocab.end_of_turn_id} - set(vocab.tool_call_ids))


# ---------------------------------------------------------------------------------------------
# weights
# ---------------------------------------------------------------------------------------------


def build_tensors(
    vocab: TinyVocab, seed: int = 0, config: Optional[TinyModelConfig] = None
) -> Dict[str, np.ndarray]:
    """All tensors of the model as float32 arrays in numpy layout (``(out, in)`` for matrices),
    in the order they are written."""
    cfg = config or TinyModelConfig()
    rng = np.random.Generator(np.random.PCG64(seed))
    d, hd, ff, nv = cfg.n_embd, cfg.head_dim, cfg.n_ff, vocab.n_vocab
    n_q, n_kv = cfg.n_head * hd, cfg.n_head_kv * hd

    def normal(shape: Tuple[int, ...], std: float) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    t: Dict[str, np.ndarray] = {}
    embd = normal((nv, d), 1.0)
    t["token_embd.weight"] = embd
    for il in range(cfg.n_layer):
        p = "blk.%d." % il
        t[p + "attn_norm.weight"] = np.ones(d, dtype=np.float32)
        t[p + "attn_q.weight"] = normal((n_q, d), cfg.attn_gain / np.sqrt(d))
        t[p + "attn_q.bias"] = normal((n_q,), 0.1)
        t[p + "attn_k.weight"] = normal((n_kv, d), cfg.attn_gain / np.sqrt(d))
        t[p + "attn_k.bias"] = normal((n_kv,), 0.1)
        t[p + "attn_v.weight"] = normal((n_kv, d), 1.0 / np.sqrt(d))
        t[p + "attn_v.bias"] = normal((n_kv,), 0.1)
        t[p + "attn_output.weight"] = normal((d, n_q), 1.0 / np.sqrt(n_q))
        t[p + "ffn_norm.weight"] = np.ones(d, dtype=np.float32)
        t[p + "ffn_gate.weight"] = normal((ff, d), 1.0 / np.sqrt(d))
        t[p + "ffn_up.weight"] = normal((ff, d), 1.0 / np.sqrt(d))
        t[p + "ffn_down.weight"] = normal((d, ff), 1.0 / np.sqrt(ff))
    t["output_norm.weight"] = np.ones(d, dtype=np.float32)

    words = np.asarray(vocab.allowed_ids, dtype=np.int64)
    if 0 < cfg.n_words < len(words):
        words = np.sort(rng.choice(words, size=cfg.n_words, replace=False))
    texts = tokenize_texts(vocab, cfg.extra_texts)
    extra = np.setdiff1d(np.asarray(extra_token_ids(vocab, cfg.extra_texts, texts), dtype=np.int64), words)
    if cfg.tool_call_tokens and not vocab.tool_call_ids:
        raise ValueError("TinyModelConfig.tool_call_tokens needs a vocab loaded with tool_call_tokens=True")
    markers = np.asarray(vocab.tool_call_ids if cfg.tool_call_tokens else (), dtype=np.int64)
    # words and <|im_end|> first: extra rows are drawn after theirs, so they do not change them
    allowed = np.concatenate([words, np.asarray([vocab.end_of_turn_id], dtype=np.int64), markers, extra])
    out = np.zeros((nv, d), dtype=np.float32)
    rows = normal((len(allowed), d), cfg.logit_scale / np.sqrt(d))
    own = embd[allowed] / np.linalg.norm(embd[allowed], axis=1, keepdims=True)
    rows -= np.float32(cfg.anti_repeat) * own
    out[allowed] = rows
    closers = sorted({seq[0] for seq, text in zip(texts, cfg.extra_texts) if text.startswith('"')}
                     if cfg.string_closers else set())
    pairs = {(a, b) for seq in texts for a, b in zip(seq, seq[1:])}
    for a, b in sorted(pairs):
        gain = cfg.marker_follow_gain if a in vocab.tool_call_ids else cfg.follow_gain
        if gain and b not in closers:
            out[b] += np.float32(gain) * embd[a] / np.linalg.norm(embd[a])
    tokens: List[str] = vocab.tokenizer_kv["tokenizer.ggml.tokens"].value
    twins = _twins(vocab, words, set(allowed.tolist()), [tokens[i] for i in extra]) if cfg.twin_gain else []
    if cfg.open_quote_gain:
        quote = tokens.index('\u0120"')
        out[words] += np.float32(cfg.open_quote_gain) * embd[quote] / np.linalg.norm(embd[quote])
    if twins:
        newline = embd[tokens.index("\u010a")]
        for word, twin in twins:
            out[twin] = out[word] + np.float32(cfg.twin_gain) * newline / np.linalg.norm(newline)
    out[closers] = out[vocab.end_of_turn_id]
    if closers and cfg.closer_after_colon:
        # where a text goes on with an opening quote (after '":'), a closer ('",' opens a string too) loses
        quote = tokens.index('\u0120"')
        for a in sorted({a for seq in texts for a, b in zip(seq, seq[1:]) if b == quote}):
            out[closers] -= np.float32(cfg.closer_after_colon) * embd[a] / np.linalg.norm(embd[a])
    embd[markers] *= np.float32(cfg.marker_embd_scale)
    t["output.weight"] = out
    bias = np.full(nv, cfg.disallowed_logit, dtype=np.float32)
    bias[allowed] = 0.0
    bias[vocab.end_of_turn_id] = cfg.end_bias
    bias[extra] = cfg.extra_bias
    pieces = [i for i in extra if re.fullmatch("[A-Za-z0-9_]+", tokens[i])]
    bias[pieces] = cfg.extra_bias + cfg.extra_piece_bias
    spaces = [i for i in extra if not tokens[i].strip("\u0120\u010a\u0109")]
    bias[spaces] = cfg.extra_bias + cfg.extra_space_bias
    for k, closer in enumerate(closers):
        bias[closer] = cfg.end_bias - cfg.closer_gap * (k + 1)
    bias[[twin for _, twin in twins]] = -cfg.twin_offset
    if len(markers):
        bias[markers[0]] = cfg.tool_call_bias
        bias[markers[1]] = cfg.tool_call_end_bias
        if cfg.tool_call_start_gain:
            nl = embd[tokens.index("\u010a")]
            out[markers[0]] += np.float32(cfg.tool_call_start_gain) * nl / np.linalg.norm(nl)
    t["output.bias"] = bias
    return t


def _twins(vocab: TinyVocab, words: np.ndarray, taken: set, pieces: Sequence[str]) -> List[Tuple[int, int]]:
    """(word, twin) ids: ``Ġabc`` and ``abc`` where ``abc`` is a token that BPE keeps whole, that is not an
    allowed token already and that does not start any of ``pieces`` (where a grammar forces a piece like
    ``name``, a twin ``na`` would win over it and the text would re-tokenize otherwise)."""
    tokens, merges = _tokens_and_merges(vocab)
    ranks = _merge_ranks(merges)
    index = {tok: i for i, tok in enumerate(tokens)}
    out = []
    for word in words.tolist():
        twin = index.get(tokens[word][1:])
        if twin is None or twin in taken or any(p.startswith(tokens[twin]) for p in pieces):
            continue
        if _bpe(tokens[twin], ranks) == [tokens[twin]]:
            out.append((word, twin))
    return out


def _quant_type(ftype: str, name: str, arr: np.ndarray) -> Any:
    import gguf

    qt = gguf.GGMLQuantizationType
    if ftype == "f32" or arr.ndim < 2 or not name.endswith(".weight"):
        return qt.F32
    if ftype == "f16":
        return qt.F16
    target = qt.Q8_0 if ftype == "q8_0" else qt.Q4_0
    block = gguf.GGML_QUANT_SIZES[target][0]
    return target if arr.shape[-1] % block == 0 else qt.F16


def _quantize_rows(arr: np.ndarray, qtype: Any) -> np.ndarray:
    """``gguf.quants.quantize`` that skips all-zero rows (most of ``output.weight``); quantization is
    row-local, so the result is identical, just faster."""
    import gguf

    nonzero = np.flatnonzero(arr.any(axis=1))
    if len(nonzero) == arr.shape[0]:
        return gguf.quants.quantize(arr, qtype)
    zero_row = gguf.quants.quantize(np.zeros((1, arr.shape[1]), dtype=np.float32), qtype)
    out = np.repeat(zero_row, arr.shape[0], axis=0)
    if len(nonzero):
        out[nonzero] = gguf.quants.quantize(arr[nonzero], qtype)
    return out


_FILE_TYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "q8_0": "MOSTLY_Q8_0", "q4_0": "MOSTLY_Q4_0"}


def _add_kv(writer: Any, key: str, val: GGUFValue) -> None:
    import gguf

    vt = gguf.GGUFValueType
    if val.vtype == _ARRAY and val.sub_type is not None:
        try:
            writer.add_key_value(key, val.value, vt.ARRAY, vt(val.sub_type))
        except TypeError:  # gguf < 0.11 has no sub_type and infers the element type
            writer.add_array(key, val.value)
    else:
        writer.add_key_value(key, val.value, vt(val.vtype))


def write_tiny_model(
    path: "os.PathLike[str] | str",
    ftype: str = "f32",
    vocab_gguf: "os.PathLike[str] | str | None" = None,
    seed: int = 0,
    config: Optional[TinyModelConfig] = None,
) -> Path:
    """Write the tiny qwen2 model to ``path`` and return it as a Path.

    ``ftype`` is one of :data:`FTYPES`; for ``q8_0``/``q4_0`` all 2-D ``*.weight`` matrices
    (including ``token_embd`` and ``output``) are quantized, norms and biases stay F32.
    ``vocab_gguf`` defaults to :func:`pytest_cachecheck.llama_server.vocab_gguf_path`.
    Written to a temp file next to ``path`` and renamed, so readers never see a partial file.
    """
    import gguf

    if ftype not in FTYPES:
        raise ValueError("ftype must be one of %s, not %r" % (", ".join(FTYPES), ftype))
    if vocab_gguf is None:
        from .llama_server import vocab_gguf_path

        vocab_gguf = vocab_gguf_path()
        if vocab_gguf is None:
            raise FileNotFoundError(
                "no ggml-vocab-qwen2.gguf found: build llama-server (python3 -m "
                "pytest_cachecheck.llama_server build) or set CACHECHECK_VOCAB_GGUF"
            )
    cfg = config or TinyModelConfig()
    vocab = load_vocab(vocab_gguf, tool_call_tokens=cfg.tool_call_tokens)
    tensors = build_tensors(vocab, seed=seed, config=cfg)

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(".%s.%d.tmp" % (out.name, os.getpid()))
    arch = "qwen2"
    writer = gguf.GGUFWriter(str(tmp), arch)
    try:
        writer.add_name("cachecheck-tiny-qwen2-%s-seed%d" % (ftype, seed))
        writer.add_context_length(cfg.n_ctx)
        writer.add_embedding_length(cfg.n_embd)
        writer.add_block_count(cfg.n_layer)
        writer.add_feed_forward_length(cfg.n_ff)
        writer.add_head_count(cfg.n_head)
        writer.add_head_count_kv(cfg.n_head_kv)
        writer.add_rope_freq_base(cfg.rope_freq_base)
        writer.add_layer_norm_rms_eps(cfg.rms_eps)
        writer.add_file_type(int(getattr(gguf.LlamaFileType, _FILE_TYPES[ftype])))
        if ftype in ("q8_0", "q4_0"):
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        for key, val in vocab.tokenizer_kv.items():
            _add_kv(writer, key, val)
        for name, arr in tensors.items():
            qtype = _quant_type(ftype, name, arr)
            if qtype == gguf.GGMLQuantizationType.F32:
                writer.add_tensor(name, arr)
            elif qtype == gguf.GGMLQuantizationType.F16:
                writer.add_tensor(name, arr.astype(np.float16))
            else:
                writer.add_tensor(name, _quantize_rows(arr, qtype), raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(str(tmp), str(out))
    except BaseException:
        writer.close()
        if tmp.exists():
            tmp.unlink()
        raise
    return out
