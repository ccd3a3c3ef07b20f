"""Shared fixtures: the real MiniLM model (loaded once per test process, the same object the
in-process pipeline uses), a tiny GPT-2 converted from a randomly initialised Hugging Face model,
small corpora, and a helper that runs `docscore run` in-process and reads its outputs back.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

# One JAX persistent compilation cache for this test session, inherited by the worker processes of
# multi_processing runs, so they reuse what the in-process runs compiled (same programs, same
# results; only compile time is saved). Set before jax is imported anywhere.
# Under pytest-xdist each worker process takes a folder of its own inside it: JAX writes an entry without a lock,
# so another process compiling the same program could read it half-written (a warning, then docscore's clean-up).
_OWN_JAX_CACHE = None
_SESSION_JAX_CACHE = "DOCSCORE_TEST_JAX_CACHE"
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _OWN_JAX_CACHE = tempfile.mkdtemp(prefix="docscore-test-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ[_SESSION_JAX_CACHE] = _OWN_JAX_CACHE
elif os.environ.get("PYTEST_XDIST_WORKER") and os.environ["JAX_COMPILATION_CACHE_DIR"] == os.environ.get(_SESSION_JAX_CACHE):
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(os.environ[_SESSION_JAX_CACHE], os.environ["PYTEST_XDIST_WORKER"])
    os.makedirs(os.environ["JAX_COMPILATION_CACHE_DIR"], exist_ok=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# Tests on CPU compile with LLVM's optimisation off (this process and the `docscore` processes it starts): XLA's CPU
# compile of a small test model takes half the time and compiling is most of what the model tests do. XLA's own HLO
# passes and its matmul libraries are the same, so every parity bound holds unchanged; benchmarks/ measure with the
# defaults, and so do the GPU tests (benchmarks/gpu_session.sh names the platform: JAX_PLATFORMS=cuda,cpu).
_XLA_FLAGS = os.environ.get("XLA_FLAGS", "")
if (os.environ.get("JAX_PLATFORMS") or "cpu") == "cpu" and "--xla_backend_optimization_level" not in _XLA_FLAGS:
    os.environ["XLA_FLAGS"] = f"{_XLA_FLAGS} --xla_backend_optimization_level=0".strip()
# gcsfs reads this once, at import: without it, it stalls ~60 s probing bucket types on the emulator.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

# In-process runs compute in this process: give it the heap settings `docscore run` gives itself (not its one
# malloc arena, which would also serialise the threads of every other test's tokenizer and Beam runner).
from pipeline.process_setup import MALLOPT_VALUES, ONE_ARENA, apply_mallopt  # noqa: E402

apply_mallopt(tuple(name for name in MALLOPT_VALUES if name != ONE_ARENA))


def pytest_unconfigure(config):
    # Under pytest-xdist the controller made the cache and its workers inherited it (their _OWN_JAX_CACHE is None):
    # the controller removes it once every worker has finished.
    if _OWN_JAX_CACHE:
        shutil.rmtree(_OWN_JAX_CACHE, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def temporary_files_in_basetemp(tmp_path_factory) -> Iterator[None]:
    """Temporary files and folders of this test process and the processes it starts go under pytest's basetemp,
    which pytest prunes, not into the system's for good: Beam's folders of jobs a test builds and never runs, the
    Dataflow tests' staging, the processes a test kills."""
    folder = str(tmp_path_factory.mktemp("tmp"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", folder)
        mp.setattr(tempfile, "tempdir", folder)
        yield


# Real English sentences of varied length (from Python's own help pages), short enough that a
# 32-token window holds each of them; LONG_TEXT needs several windows.
SENTENCES = [
    "The if statement is used for conditional execution.",
    "A for loop iterates over the items of any sequence in the order they appear.",
    "Comparisons can be chained arbitrarily.",
    "The import statement finds a module, loads and initializes it if necessary.",
    "Dictionaries map hashable keys to arbitrary objects and are mutable.",
    "Integer literals are unlimited in length apart from what can be stored in memory.",
    "The while statement is used for repeated execution as long as an expression is true.",
    "String literals can be enclosed in matching single quotes or double quotes.",
    "Lambda expressions are used to create anonymous functions.",
    "The raise statement without arguments re-raises the exception that is currently being handled.",
    "Slicings select a range of items in a sequence object such as a string, tuple or list.",
    "The try statement specifies exception handlers and cleanup code for a group of statements.",
]
LONG_TEXT = " ".join(SENTENCES[:5])  # 66 tokens: three 32-token windows with stride 8

def shards_of(pattern: str, **kwargs) -> list[str]:
    """The shards `--input pattern` finds (pipeline.io.input_files.find_input)."""
    from pipeline.io.input_files import find_input

    return find_input(pattern, **kwargs).shards


# Every in-process test run uses these, so the compiled shapes ([8, 16] and [8, 32]) are shared.
TEST_MAX_LEN = 32
TEST_BATCH = 8
TEST_STRIDE = 8


@pytest.fixture(scope="session")
def minilm():
    """all-MiniLM-L6-v2 with the native kernel, from the pipeline's own process-wide cache."""
    from pipeline.stages.inference import ModelSpec, shared_model

    return shared_model(ModelSpec("minilm-l6", attention="native"))


def direct_embeddings(loaded, texts: list[str], *, max_len: int = TEST_MAX_LEN, stride: int = TEST_STRIDE,
                      max_windows: int = 8) -> np.ndarray:
    """Embeddings computed by calling loaded.embed_packed directly: one window per row (segment 1), padded
    to max_len, 8 rows a call, each document the normalised mean of its window embeddings."""
    encoded = loaded.tokenizer.encode_windows(texts, max_len=max_len, stride=stride, max_windows=max_windows)
    windows = [w for doc in encoded for w in doc.windows]
    outputs = []
    for start in range(0, len(windows), TEST_BATCH):
        ids = np.zeros((TEST_BATCH, max_len), np.int32)
        seg = np.zeros((TEST_BATCH, max_len), np.int32)
        for r, w in enumerate(windows[start:start + TEST_BATCH]):
            ids[r, :len(w)], seg[r, :len(w)] = w, 1
        outputs.append(loaded.embed_packed(ids, seg, 1)[: len(windows[start:start + TEST_BATCH]), 0])
    flat = np.concatenate(outputs)
    result, k = [], 0
    for doc in encoded:
        mean = flat[k:k + len(doc.windows)].astype(np.float64).mean(axis=0)
        result.append(mean / np.linalg.norm(mean))
        k += len(doc.windows)
    return np.stack(result)


def write_jsonl(path: Path, records: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


def read_table(out: Path, table: str, run_id: str):
    """The committed table of a run (the files its summary.json names) as a pandas DataFrame (parquet or
    jsonl), and its files."""
    import pandas as pd

    from pipeline.io import run_commit

    assert run_commit.committed_summary(str(out), run_id) is not None, f"run {run_id} under {out} is not committed"
    files = [Path(f) for f in run_commit.committed_files(str(out), run_id, table)]
    assert files, f"run {run_id} names no {table} files"
    if files[0].suffix == ".parquet":
        return pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True), files
    rows = [json.loads(line) for f in files for line in open(f, encoding="utf-8") if line.strip()]
    return pd.DataFrame(rows), files


def read_summary(out: Path, run_id: str) -> dict:
    with open(out / "runs" / f"run_id={run_id}" / "summary.json") as f:
        return json.load(f)


def run_docscore(*args: str) -> int:
    """`docscore run ARGS` in this process (the way the console script calls it)."""
    from pipeline.launch import main

    return main([str(a) for a in args])


def common_flags(run_id: str, out: Path) -> list[str]:
    # test corpora hold deliberate bad records: --max_error_fraction 1 keeps the error gate (exit 4) out
    # of tests about other things; tests/test_bad_input.py tests the gate at its default
    return ["--output", str(out), "--run_id", run_id, "--max_seq_len", str(TEST_MAX_LEN),
            "--batch_size", str(TEST_BATCH), "--stride", str(TEST_STRIDE), "--max_error_fraction", "1"]


def perturb_parameters(model, chosen) -> None:
    """Add noise to the parameters of a random transformers model whose names `chosen` accepts: norm scales start at
    ones, norm shifts and biases at zeros, and values of their own catch one read into the wrong place."""
    import torch

    with torch.no_grad():
        for name, weight in model.named_parameters():
            if chosen(name):
                weight.add_(0.2 * torch.randn_like(weight))


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tmp_path_factory) -> str:
    """A 2-layer GPT-2 (random weights and layer norms, seed 0) with a byte-level BPE tokenizer trained on Python's
    help pages, saved by transformers as safetensors and converted with models.hf_import."""
    import torch
    import transformers
    from pydoc_data.topics import topics
    from tokenizers import Tokenizer, decoders, models as tok_models, pre_tokenizers, trainers

    from models.hf_import import convert_hf_dir

    root = tmp_path_factory.mktemp("gpt2")
    hf_dir, out_dir = root / "hf", root / "docscore"
    tokenizer = Tokenizer(tok_models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"], show_progress=False)
    tokenizer.train_from_iterator([topics[k] for k in sorted(topics)][:20], trainer=trainer)
    hf_dir.mkdir()
    tokenizer.save(str(hf_dir / "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=tokenizer.get_vocab_size(), n_positions=64, n_embd=32,
                                     n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).eval()
    perturb_parameters(model, lambda name: ".ln_" in name or name.startswith("transformer.ln_"))
    model.save_pretrained(str(hf_dir), safe_serialization=True)
    convert_hf_dir(str(hf_dir), str(out_dir))
    return str(out_dir)


@pytest.fixture(scope="session")
def tiny_gpt2_hf(tiny_gpt2_dir):
    """The same tiny GPT-2 as a transformers model (the independent reference)."""
    import transformers

    hf_dir = os.path.join(os.path.dirname(tiny_gpt2_dir), "hf")
    return transformers.GPT2LMHeadModel.from_pretrained(hf_dir).eval()


# Configuration-error tests: a tiny corpus, and a guard that no shard is read before the error.
@pytest.fixture
def corpus(tmp_path):
    return write_jsonl(tmp_path / "in" / "docs.jsonl", [{"id": f"d{i}", "text": f"document {i}"} for i in range(3)])


@pytest.fixture
def no_data_read(monkeypatch):
    """Fail the test if any shard is read by the pipeline; record schema peeks by validation."""
    from pipeline import input_checks
    from pipeline.io import sources

    peeks = []

    def read_shard(*_args, **_kwargs):
        raise AssertionError("a shard was read before the configuration error was reported")

    real_peek = input_checks.first_record_fields
    monkeypatch.setattr(sources, "read_shard", read_shard)
    monkeypatch.setattr(input_checks, "first_record_fields", lambda *a, **k: peeks.append(a) or real_peek(*a, **k))
    return peeks


def padded(docs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Token id lists as right-padded rows: (ids, segment ids 1 on tokens, 0 on padding)."""
    length = max(map(len, docs))
    ids, segments = np.zeros((len(docs), length), np.int32), np.zeros((len(docs), length), np.int32)
    for row, doc in enumerate(docs):
        ids[row, :len(doc)], segments[row, :len(doc)] = doc, 1
    return ids, segments


def transformers_hidden(model, ids: np.ndarray, segments: np.ndarray) -> np.ndarray:
    """A transformers encoder's last_hidden_state over right-padded rows (attention_mask 1 on tokens), float32."""
    import torch

    with torch.no_grad():
        return model(input_ids=torch.as_tensor(ids, dtype=torch.long),
                     attention_mask=torch.as_tensor(segments > 0, dtype=torch.long)).last_hidden_state.numpy()


def transformers_logprobs(hf_dir, ids: np.ndarray, segments: np.ndarray, model_class: str = "AutoModelForCausalLM"
                          ) -> np.ndarray:
    """Reference: transformers' `model_class` (default AutoModelForCausalLM) log p(ids[t+1] | ids[:t+1]) from
    input_ids alone over right-padded rows (float32 model, float64 log-softmax); 0 past each row's last real token."""
    import torch
    import transformers

    model = getattr(transformers, model_class).from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(segments)).logits
    logprobs = torch.log_softmax(logits.double(), dim=-1).numpy()
    expected = np.zeros(ids.shape, np.float64)
    for row in range(len(ids)):
        for t in range(int(segments[row].sum()) - 1):
            expected[row, t] = logprobs[row, t, ids[row, t + 1]]
    return expected



@contextlib.contextmanager
def no_free_file_descriptors(leave: int = 0):
    """This process out of file descriptors, as under `ulimit -n` with many shards: the soft RLIMIT_NOFILE lowered
    and every descriptor under it taken but `leave` (opening more files at once then fails with EMFILE); both
    restored after."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    taken: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 4096), hard))
    try:
        while True:
            try:
                taken.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as e:
                assert e.errno == errno.EMFILE, e
                break
        for _ in range(leave):
            os.close(taken.pop())
        yield
    finally:
        for fd in taken:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def byte_level_bpe(specials: list[str]):
    """A byte-level BPE tokenizer (as RoBERTa's and ModernBERT's) trained on SENTENCES with `specials` first in its
    vocabulary; the caller sets the post-processor that places them."""
    from tokenizers import Tokenizer, decoders, models as tok_models, pre_tokenizers, trainers

    tokenizer = Tokenizer(tok_models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(SENTENCES * 4, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return tokenizer
