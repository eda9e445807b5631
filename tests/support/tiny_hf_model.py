"""Write a tiny random-weight Qwen2 model directory (Hugging Face layout) that vLLM can serve.

Run with the Python of the vLLM venv (it needs torch, safetensors and transformers) and the repository root on
``PYTHONPATH`` (it borrows the vocabulary reader of :mod:`pytest_cachecheck.tinymodel`)::

    PYTHONPATH=. <venv>/bin/python tests/support/tiny_hf_model.py OUT_DIR VOCAB_GGUF [SEED]

The model: ``Qwen2ForCausalLM``, 2 layers, hidden size 128 (4 query heads and 2 KV heads of width 32: vLLM's
CPU attention wants a head size of at least 32), FFN 256, safetensors in float32, and the real Qwen2
byte-level BPE tokenizer (vocabulary, merges, ChatML chat template) read from llama.cpp's
``ggml-vocab-qwen2.gguf``, so answers are real-looking words.

The weights are random, but shaped (like :mod:`pytest_cachecheck.tinymodel`'s GGUF demo models) so that the
prompt cache can be measured:

* only whole lowercase words (``Ġ`` plus 2-8 ASCII letters, each its own BPE encoding) and ``<|im_end|>`` can
  win. An answer then re-tokenizes, inside the chat history, to exactly the ids it was generated as, and a
  turn-2 cache hit can reach into it. Qwen2's ``lm_head`` has no bias, so one residual dimension
  (:data:`BIAS_DIM`) holds a constant: every embedding row has it, no random weight reads or writes it, and
  ``lm_head`` reads it as a bias: a large negative one for every other token;
* each word's output row points away from that word's own embedding, so a word does not follow itself and
  answers vary like words do (without it, answers were runs of one token);
* answer length: a length head in layer 0 (zero queries, so it attends evenly to the whole context) averages
  the marks of :data:`MARKS`, giving ``marks / n`` for a context of ``n`` tokens; ``<|im_end|>`` reads it as a
  negative bias, so it cannot win while the context is short. On the 20 built-in probes (Hugging Face float32
  forward) turn-1 answers run 135-183 tokens (a turn-2 hit then reaches a whole 128-token block past the
  turn-1 prompt on all of them) and turn-2 answers 11-88 (mean 56), which keeps a probe's six requests short.

Everything follows from the seed (numpy PCG64), so a directory is the same on every machine. The directory is
written under a temporary name and renamed, so a reader never sees half of it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

from pytest_cachecheck.tinymodel import END_OF_TURN, allowed_token_ids, read_gguf_metadata

MODEL_VERSION = 1
"""Bump when the weights or files change: it names the cache folder (``hf-tiny-qwen2-v<N>``)."""

BIAS_DIM, MARK_DIM, LEN_DIM = 0, 1, 2
"""Residual dimensions kept out of the random weights: a constant that ``lm_head`` reads as a bias; marks on
the tokens that open a conversation and each of its messages; and the marks' sum over the context divided by
its length, which layer 0's length head writes."""
RESERVED = (BIAS_DIM, MARK_DIM, LEN_DIM)
MARKS = {"system": 0.325, "<|im_start|>": 0.225}
"""Mark of each token in :data:`MARK_DIM`. The chat template opens every conversation with one ``system``
token (its own default system message when there is none) and every message with ``<|im_start|>``, so a
turn-1 prompt carries marks summing to 1 and a turn-2 prompt 1.45: turn 2 may run on for 45% more context."""

# the pre-tokenizer of Qwen2's tokenizer.json (Hugging Face Qwen/Qwen2-*): GPT-4-like splitting, digits alone
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class TinyHFConfig:
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 256
    max_positions: int = 4096
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    bias_value: float = 4.0
    """The constant in :data:`BIAS_DIM` of every embedding row."""
    logit_scale: float = 4.0
    """Standard deviation of the words' logits, before the anti-repeat term."""
    anti_repeat: float = 3.0
    """How strongly a word's output row points away from its own embedding."""
    attn_gain: float = 2.0
    end_weight: float = 10.0
    """``lm_head`` weight of ``<|im_end|>`` on :data:`BIAS_DIM` (about 28 in logits) once the context is long."""
    len_weight: float = -450.0
    """``lm_head`` weight of ``<|im_end|>`` on :data:`LEN_DIM` (negative): how much a short context holds the
    end of the answer back."""
    len_write: float = 8.0
    """What the length head writes into :data:`LEN_DIM`: ``len_write / n`` at a context of ``n`` tokens."""
    end_noise: float = 0.25
    """Scale of the random part of ``<|im_end|>``'s output row, relative to a word's."""
    disallowed_weight: float = -3000.0
    """``lm_head`` weight on :data:`BIAS_DIM` of every token that is neither a word nor ``<|im_end|>``."""


def _normal(rng: np.random.Generator, shape: Tuple[int, ...], std: float) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)


def build_weights(n_vocab: int, words: List[int], end_id: int, marks: Dict[int, float], seed: int = 0,
                  cfg: TinyHFConfig = TinyHFConfig()) -> Dict[str, np.ndarray]:
    """The model's tensors in Hugging Face Qwen2 naming, float32, ``(out, in)`` matrices.

    Random weights never read or write the :data:`RESERVED` dimensions. Layer 0's query heads 2 and 3 (which
    share KV head 1) are the length head: zero queries attend evenly to the whole context, and the value is
    the :data:`MARK_DIM` mark, so the head reads the marks' sum over ``n``, the length of the context.
    """
    rng = np.random.Generator(np.random.PCG64(seed))
    d, ff = cfg.hidden, cfg.ffn
    hd = d // cfg.heads
    n_q, n_kv = cfg.heads * hd, cfg.kv_heads * hd
    free = np.ones(d, dtype=np.float32)
    free[list(RESERVED)] = 0.0

    t: Dict[str, np.ndarray] = {}
    embd = _normal(rng, (n_vocab, d), 1.0) * free
    embd[:, BIAS_DIM] = cfg.bias_value
    for token, mark in marks.items():
        embd[token, MARK_DIM] = mark
    t["model.embed_tokens.weight"] = embd

    def reads(shape: Tuple[int, int], std: float) -> np.ndarray:
        return _normal(rng, shape, std) * free[None, :]  # a projection that ignores the reserved dimensions

    def writes(shape: Tuple[int, int], std: float) -> np.ndarray:
        return _normal(rng, shape, std) * free[:, None]  # one whose output leaves them alone

    for il in range(cfg.layers):
        p = f"model.layers.{il}."
        q, qb = reads((n_q, d), cfg.attn_gain / np.sqrt(d)), _normal(rng, (n_q,), 0.1)
        k, kb = reads((n_kv, d), cfg.attn_gain / np.sqrt(d)), _normal(rng, (n_kv,), 0.1)
        v, vb = reads((n_kv, d), 1.0 / np.sqrt(d)), _normal(rng, (n_kv,), 0.1)
        o = writes((d, n_q), 1.0 / np.sqrt(n_q))
        if il == 0:  # the length head: query heads 2-3, KV head 1
            q[2 * hd:], qb[2 * hd:] = 0.0, 0.0
            k[hd:], kb[hd:], v[hd:], vb[hd:] = 0.0, 0.0, 0.0, 0.0
            v[hd, MARK_DIM] = 1.0
            o[:, 2 * hd:] = 0.0
            o[LEN_DIM, 2 * hd] = cfg.len_write
        t[p + "input_layernorm.weight"] = np.ones(d, dtype=np.float32)
        t[p + "self_attn.q_proj.weight"], t[p + "self_attn.q_proj.bias"] = q, qb
        t[p + "self_attn.k_proj.weight"], t[p + "self_attn.k_proj.bias"] = k, kb
        t[p + "self_attn.v_proj.weight"], t[p + "self_attn.v_proj.bias"] = v, vb
        t[p + "self_attn.o_proj.weight"] = o
        t[p + "post_attention_layernorm.weight"] = np.ones(d, dtype=np.float32)
        t[p + "mlp.gate_proj.weight"] = reads((ff, d), 1.0 / np.sqrt(d))
        t[p + "mlp.up_proj.weight"] = reads((ff, d), 1.0 / np.sqrt(d))
        t[p + "mlp.down_proj.weight"] = writes((d, ff), 1.0 / np.sqrt(ff))
    t["model.norm.weight"] = np.ones(d, dtype=np.float32)

    allowed = np.asarray(sorted(words) + [end_id], dtype=np.int64)
    head = np.zeros((n_vocab, d), dtype=np.float32)
    head[:, BIAS_DIM] = cfg.disallowed_weight
    rows = _normal(rng, (len(allowed), d), cfg.logit_scale / np.sqrt(d)) * free[None, :]
    own = embd[allowed] * free[None, :]
    own /= np.linalg.norm(own, axis=1, keepdims=True)
    rows -= np.float32(cfg.anti_repeat) * own
    rows[-1] *= np.float32(cfg.end_noise)
    rows[-1, BIAS_DIM] = cfg.end_weight
    rows[-1, LEN_DIM] = cfg.len_weight
    head[allowed] = rows
    t["lm_head.weight"] = head
    return t


def tokenizer_json(tokens: List[str], token_types: List[int], merges: List[str]) -> Dict[str, object]:
    """Qwen2's tokenizer.json: byte-level BPE, the Qwen2 split regex, the control tokens as special tokens."""
    special = [i for i, kind in enumerate(token_types) if kind == 3]  # CONTROL: <|endoftext|>, <|im_*|>
    vocab = {tok: i for i, tok in enumerate(tokens) if token_types[i] == 1}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i in special],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        ]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


def _transformers_version() -> str:
    # without it, transformers 5 takes a local tokenizer for a possibly broken Mistral one and warns
    import transformers

    return str(transformers.__version__)


def write_model(out: "os.PathLike[str] | str", vocab_gguf: "os.PathLike[str] | str", seed: int = 0,
                cfg: TinyHFConfig = TinyHFConfig()) -> Path:
    """Write the model directory to ``out`` (via a temporary sibling directory and a rename)."""
    import torch
    from safetensors.torch import save_file

    meta = read_gguf_metadata(vocab_gguf)
    tokens: List[str] = meta["tokenizer.ggml.tokens"].value
    types: List[int] = meta["tokenizer.ggml.token_type"].value
    merges: List[str] = meta["tokenizer.ggml.merges"].value
    template: str = meta["tokenizer.chat_template"].value
    end_id = tokens.index(END_OF_TURN)
    marks = {tokens.index(token): mark for token, mark in MARKS.items()}
    pad_id = tokens.index("<|endoftext|>")
    words = allowed_token_ids(tokens, merges)
    if len(words) < 1000:
        raise ValueError(f"{vocab_gguf}: only {len(words)} whole-word tokens; the Qwen2 vocabulary is needed")
    weights = build_weights(len(tokens), words, end_id, marks, seed, cfg)

    dest = Path(out)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=str(dest.parent)))
    try:
        save_file({k: torch.from_numpy(v) for k, v in weights.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        config = {
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": len(tokens),
            "hidden_size": cfg.hidden, "intermediate_size": cfg.ffn, "num_hidden_layers": cfg.layers,
            "num_attention_heads": cfg.heads, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.hidden // cfg.heads,
            "hidden_act": "silu", "max_position_embeddings": cfg.max_positions, "rms_norm_eps": cfg.rms_eps,
            "rope_theta": cfg.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": None,
            "max_window_layers": cfg.layers, "attention_dropout": 0.0, "initializer_range": 0.02,
            "bos_token_id": pad_id, "eos_token_id": end_id, "pad_token_id": pad_id, "torch_dtype": "float32",
            "dtype": "float32", "use_cache": True, "transformers_version": _transformers_version(),
        }
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        # no sampling defaults: vLLM's --generation-config auto then keeps its neutral ones
        (tmp / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": pad_id, "eos_token_id": [end_id, pad_id], "pad_token_id": pad_id}, indent=2) + "\n")
        (tmp / "tokenizer.json").write_text(json.dumps(tokenizer_json(tokens, types, merges), ensure_ascii=False))
        special = {str(i): {"content": tokens[i], "lstrip": False, "normalized": False, "rstrip": False,
                            "single_word": False, "special": True} for i, kind in enumerate(types) if kind == 3}
        (tmp / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "Qwen2Tokenizer", "added_tokens_decoder": special, "bos_token": None,
            "eos_token": END_OF_TURN, "pad_token": "<|endoftext|>", "unk_token": None,
            "chat_template": template, "model_max_length": cfg.max_positions, "clean_up_tokenization_spaces": False,
            "errors": "replace", "split_special_tokens": False, "add_prefix_space": False,
        }, indent=2) + "\n")
        (tmp / "cachecheck.json").write_text(json.dumps({
            "what": "pytest-cachecheck tiny random-weight Qwen2 model (tests/support/tiny_hf_model.py)",
            "version": MODEL_VERSION, "seed": seed, "config": asdict(cfg), "vocab": Path(vocab_gguf).name,
            "words": len(words)}, indent=2) + "\n")
        os.chmod(str(tmp), 0o755)
        if dest.exists():
            shutil.rmtree(str(dest))
        os.rename(str(tmp), str(dest))
    except BaseException:
        shutil.rmtree(str(tmp), ignore_errors=True)
        raise
    return dest


def main(argv: List[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: PYTHONPATH=. python tests/support/tiny_hf_model.py OUT_DIR VOCAB_GGUF [SEED]", file=sys.stderr)
        return 2
    print(write_model(argv[0], argv[1], int(argv[2]) if len(argv) == 3 else 0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
