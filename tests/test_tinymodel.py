"""Unit tests for pytest_cachecheck.tinymodel (no llama-server needed).

The tests that write real models need ``ggml-vocab-qwen2.gguf`` (next to the cached llama-server
build or named by ``$CACHECHECK_VOCAB_GGUF``) and are skipped without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict

import pytest

np = pytest.importorskip("numpy")
gguf = pytest.importorskip("gguf")

from pytest_cachecheck import tinymodel  # noqa: E402
from pytest_cachecheck.llama_server import vocab_gguf_path  # noqa: E402


@pytest.fixture(scope="module")
def vocab_path() -> Path:
    path = vocab_gguf_path()
    if path is None:
        pytest.skip("ggml-vocab-qwen2.gguf not available (build llama-server or set CACHECHECK_VOCAB_GGUF)")
    return path


def _write_small_vocab(path: Path) -> Path:
    """A synthetic byte-level BPE vocab: letters, 'Ġ', 'Ġa'..'Ġz', 676 two-letter words, specials."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens = letters + ["\u0120"] + ["\u0120" + a for a in letters]
    merges = ["\u0120 " + a for a in letters]
    for a in letters:
        for b in letters:
            tokens.append("\u0120" + a + b)
            merges.append("\u0120%s %s" % (a, b))
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens += specials
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 3) + [3, 3, 3])
    w.add_token_merges(merges)
    w.add_eos_token_id(tokens.index("<|endoftext|>"))
    w.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def small_models(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    out = tmp_path_factory.mktemp("tinymodels")
    vocab = _write_small_vocab(out / "vocab.gguf")
    return {f: tinymodel.write_tiny_model(out / ("tiny-%s.gguf" % f), f, vocab_gguf=vocab, seed=1)
            for f in tinymodel.FTYPES}


def test_allowed_token_ids_uses_bpe() -> None:
    tokens = ["a", "b", "c", "\u0120", "\u0120a", "\u0120ab", "\u0120abc", "\u0120Ab", "\u0120b", "ab"]
    # "Ġab" is reachable (Ġ+a, then Ġa+b); "Ġabc" is in the vocab but no merge produces it
    merges = ["\u0120 a", "\u0120a b", "a b"]
    ids = tinymodel.allowed_token_ids(tokens, merges)
    assert [tokens[i] for i in ids] == ["\u0120ab"]


def test_metadata_reader_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "kv.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_uint32("t.u32", 7)
    w.add_float32("t.f32", 0.5)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "h\u00e9llo")
    w.add_array("t.strs", ["x", "yz", ""])
    w.add_array("t.ints", [1, -2, 3])
    w.add_tensor("w.weight", np.arange(64, dtype=np.float32).reshape(2, 32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    meta = tinymodel.read_gguf_metadata(path)
    assert meta["general.architecture"].value == "qwen2"
    assert meta["t.u32"].value == 7
    assert meta["t.f32"].value == 0.5
    assert meta["t.bool"].value is True
    assert meta["t.str"].value == "h\u00e9llo"
    assert meta["t.strs"].value == ["x", "yz", ""]
    assert meta["t.ints"].value == [1, -2, 3]
    infos = tinymodel.read_gguf_tensor_infos(path)
    assert infos == {"w.weight": ((32, 2), int(gguf.GGMLQuantizationType.F32))}


def test_build_tensors_deterministic_and_masked(vocab_path: Path) -> None:
    vocab = tinymodel.load_vocab(vocab_path)
    assert len(vocab.allowed_ids) > 1000
    assert vocab.tokenizer_kv["tokenizer.ggml.tokens"].value[vocab.end_of_turn_id] == "<|im_end|>"
    a = tinymodel.build_tensors(vocab, seed=3)
    b = tinymodel.build_tensors(vocab, seed=3)
    c = tinymodel.build_tensors(vocab, seed=4)
    assert list(a) == list(b)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["blk.0.attn_q.weight"], c["blk.0.attn_q.weight"])
    bias = a["output.bias"]
    allowed = np.zeros(vocab.n_vocab, dtype=bool)
    allowed[list(vocab.allowed_ids)] = True
    allowed[vocab.end_of_turn_id] = True
    assert (bias[~allowed] <= -1000).all()
    assert (bias[allowed] >= 0).all()


@pytest.mark.parametrize("ftype", ["q4_0"])
def test_written_model_layout(vocab_path: Path, tmp_path: Path, ftype: str) -> None:
    path = tinymodel.write_tiny_model(tmp_path / "tiny.gguf", ftype, vocab_gguf=vocab_path)
    assert not [p.name for p in tmp_path.iterdir() if p.name != "tiny.gguf"]  # no temp file left
    meta = tinymodel.read_gguf_metadata(path)
    vocab_meta = tinymodel.read_gguf_metadata(vocab_path)
    tok_keys = {k for k in vocab_meta if k.startswith("tokenizer.")}
    assert "tokenizer.chat_template" in tok_keys
    for key in tok_keys:
        assert meta[key].value == vocab_meta[key].value, key
    assert meta["general.architecture"].value == "qwen2"
    assert meta["qwen2.block_count"].value == 2
    assert meta["qwen2.embedding_length"].value == 128
    assert meta["qwen2.context_length"].value == 4096
    expected_ft = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                   "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[ftype]
    assert meta["general.file_type"].value == int(expected_ft)

    infos = tinymodel.read_gguf_tensor_infos(path)
    qt = gguf.GGMLQuantizationType
    want = {"f32": qt.F32, "f16": qt.F16, "q8_0": qt.Q8_0, "q4_0": qt.Q4_0}[ftype]
    n_vocab = len(vocab_meta["tokenizer.ggml.tokens"].value)
    assert infos["token_embd.weight"] == ((128, n_vocab), int(want))
    assert infos["output.weight"] == ((128, n_vocab), int(want))
    assert infos["output.bias"] == ((n_vocab,), int(qt.F32))
    assert infos["blk.1.ffn_down.weight"] == ((256, 128), int(want))
    assert infos["blk.0.attn_k.weight"] == ((128, 64), int(want))
    assert infos["blk.0.attn_norm.weight"][1] == int(qt.F32)
    assert infos["blk.0.attn_q.bias"][1] == int(qt.F32)
    assert len(infos) == 4 + 2 * 12


@pytest.mark.parametrize("ftype", tinymodel.FTYPES)
def test_gguf_reader_loads_each_ftype(small_models: Dict[str, Path], ftype: str) -> None:
    reader = gguf.GGUFReader(str(small_models[ftype]))
    tokens = [bytes(reader.fields["tokenizer.ggml.tokens"].parts[i]).decode()
              for i in reader.fields["tokenizer.ggml.tokens"].data]
    assert len(tokens) == 26 + 1 + 26 + 676 + 3
    assert "tokenizer.chat_template" in reader.fields
    assert "tokenizer.ggml.merges" in reader.fields
    names = {t.name: t for t in reader.tensors}
    assert len(names) == 4 + 2 * 12
    qt = gguf.GGMLQuantizationType
    want = {"f32": qt.F32, "f16": qt.F16, "q8_0": qt.Q8_0, "q4_0": qt.Q4_0}[ftype]
    for name, t in names.items():
        is_matrix = name.endswith(".weight") and len(t.shape) == 2
        assert t.tensor_type == (want if is_matrix else qt.F32), name
    emb = names["output.weight"]
    rows = gguf.quants.dequantize(emb.data, emb.tensor_type)
    assert rows.shape == (len(tokens), 128)
    bias = names["output.bias"].data
    # only the 676 two-letter words and <|im_end|> can win; everything else is masked
    live = np.flatnonzero(bias > -1000)
    assert [tokens[i] for i in live] == tokens[53:729] + ["<|im_end|>"]
    assert np.isfinite(rows).all()
    assert not rows[:53].any()


def test_same_seed_same_bytes(small_models: Dict[str, Path], tmp_path: Path) -> None:
    vocab = small_models["f32"].parent / "vocab.gguf"
    again = tinymodel.write_tiny_model(tmp_path / "again.gguf", "q4_0", vocab_gguf=vocab, seed=1)
    assert again.read_bytes() == small_models["q4_0"].read_bytes()
    other = tinymodel.write_tiny_model(tmp_path / "other.gguf", "q4_0", vocab_gguf=vocab, seed=2)
    assert other.read_bytes() != again.read_bytes()
