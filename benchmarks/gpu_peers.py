"""GPU mode of compare_peers.py: `docscore run --task embed` end to end against sentence-transformers
(PyTorch on CUDA) on the same GPU, the same documents and the same random MiniLM-shaped weights, in one run.

  peer: sentence-transformers encode (model loaded and warmed first, not timed), float32 and bfloat16,
        batch 32 (its default) and 256
  docscore: the whole `docscore run` command (start-up, model load, Beam, tables, report), each setting
        once with an empty persistent compilation cache (cold) and then warm; float32 and bfloat16,
        native and flash kernels; a 12-layer BERT-base-shaped model for the device busy fraction

Random weights because a device machine may not hold the real ones (speed does not depend on values; the
float32 parity against PyTorch float32 is as meaningful). The corpus is JSONL (id, text) of paragraphs
that fit one 256-token window, so both sides embed exactly the same tokens. Writes gpu_peers.json and
gpu_peers.md (a table with the machine named) to --out. Not a test.

    python benchmarks/compare_peers.py --gpu --corpus corpus.jsonl.gz --hf_config MINILM_DIR --out DIR
    DEVICE=cpu ... --docs 300 --quick            # try it on a CPU first
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LEN = 256  # sentence_bert_config max_seq_length
ST_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
            "modules.json", "1_Pooling", "sentence_bert_config.json", "config_sentence_transformers.json")
# label -> (model, attention, dtype, extra flags, compilation cache: the first run of a cache is cold)
RUNS = {
    "bf16_flash": ("minilm", "flash", "bfloat16", [], "c1"),
    "bf16_flash_1thread": ("minilm", "flash", "bfloat16", ["--direct_num_workers", "1"], "c1"),
    "bf16_flash_4threads": ("minilm", "flash", "bfloat16",
                            ["--direct_running_mode", "multi_threading", "--direct_num_workers", "4"], "c1"),
    "bf16_flash_8threads": ("minilm", "flash", "bfloat16",
                            ["--direct_running_mode", "multi_threading", "--direct_num_workers", "8"], "c1"),
    # worker processes: host work (tokenize, pack, score, write) on several cores, each process's calls on the one GPU
    "bf16_flash_4procs": ("minilm", "flash", "bfloat16",
                          ["--direct_running_mode", "multi_processing", "--direct_num_workers", "4"], "c1"),
    # cold with XLA's GPU autotuning off (its own cache): how much of a cold start autotuning is, and what it buys
    "bf16_flash_autotune0": ("minilm", "flash", "bfloat16", [], "c7"),
    "bf16_native": ("minilm", "native", "bfloat16", [], "c3"),
    "f32_native": ("minilm", "native", "float32", [], "c4"),
    "bert12_bf16_flash": ("bert12", "flash", "bfloat16", [], "c6"),
}
RUN_ENV = {"bf16_flash_autotune0": {"XLA_FLAGS": "--xla_gpu_autotune_level=0"}}  # added to a run's environment
# most telling first: a run cut short by a time limit keeps what it measured
DEFAULT_RUNS = ["bf16_flash", "bf16_flash", "bert12_bf16_flash", "bert12_bf16_flash", "bf16_flash_1thread",
                "bf16_flash_4procs", "bf16_flash_4threads", "bf16_flash_autotune0", "f32_native", "f32_native",
                "bf16_native", "bf16_native"]
BERT_BASE = {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072, "num_hidden_layers": 12}


def log(results: dict, out: str, key: str, value) -> None:
    results[key] = value
    print(key, json.dumps(value)[:1500], flush=True)
    with open(os.path.join(out, "gpu_peers.json"), "w") as f:
        json.dump(results, f, indent=1)


def read_texts(path: str, n: int) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for _, line in zip(range(n), f)]


def environment(device: str) -> dict:
    import jax
    import torch

    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    # jax's version only: starting its GPU backend here would take most of the GPU's memory from the runs
    return {"gpu": torch.cuda.get_device_name(0) if device == "cuda" else "none", "cpu": cpu,
            "cores": os.cpu_count(), "torch": torch.__version__, "jax": jax.__version__,
            "python": platform.python_version()}


def random_hf_model(config_dir: str, dest: str, overrides: dict | None = None) -> str:
    """A BertModel with random weights (std 0.05, so documents differ) in dest, with config_dir's tokenizer
    and sentence-transformers files; `overrides` change the config (e.g. a 12-layer BERT-base shape)."""
    import torch
    import transformers

    if os.path.exists(os.path.join(dest, "model.safetensors")):
        return dest
    os.makedirs(dest, exist_ok=True)
    for name in ST_FILES:
        src = os.path.join(config_dir, name)
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(dest, name), dirs_exist_ok=True)
        elif os.path.exists(src):
            shutil.copy(src, dest)
    config = transformers.BertConfig.from_pretrained(dest, **(overrides or {}))
    torch.manual_seed(0)
    model = transformers.BertModel(config, add_pooling_layer=False)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.05)
    model.save_pretrained(dest, safe_serialization=True)
    return dest


def run_peer(hf_dir: str, texts: list[str], dtype: str, batch: int, device: str):
    """sentence-transformers encode of every text (model loaded and warmed on 1,024 texts first)."""
    import torch
    from sentence_transformers import SentenceTransformer

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    model = SentenceTransformer(hf_dir, device=device)
    model.max_seq_length = MAX_LEN
    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    model.encode(texts[:1024], batch_size=batch)
    sync()
    start = time.perf_counter()
    embeddings = model.encode(texts, batch_size=batch, convert_to_tensor=True)
    sync()
    seconds = time.perf_counter() - start
    result = embeddings.float().cpu().numpy()
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return result, {"encode_s": round(seconds, 3), "docs_per_s": round(len(texts) / seconds)}


def run_docscore(corpus: str, model_dir: str, out: str, attention: str, dtype: str, flags: list[str],
                 env: dict) -> dict:
    """One whole `docscore run --task embed` command: its wall time and its summary's facts."""
    import numpy as np
    import pyarrow.parquet as pq

    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "pipeline", "run", "--input", corpus, "--output", out, "--task", "embed",
           "--model", model_dir, "--attention", attention, "--dtype", dtype, "--run_id", "r", "--no_progress",
           "--max_error_fraction", "1", *flags]
    start = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - start
    record = {"rc": p.returncode, "command_s": round(wall, 2)}
    if p.returncode:
        record["stderr"] = p.stderr[-3000:]
        return record
    summary = json.load(open(os.path.join(out, "runs", "run_id=r", "summary.json")))
    scored = summary["counts"]["scored"]
    record.update(
        docs=scored, docs_per_s=round(scored / wall), pipeline_s=round(summary["wall_s"], 2),
        pipeline_docs_per_s=round(scored / summary["wall_s"]), kernel=summary["kernel"],
        device=summary.get("device"), compile=summary.get("compile"), batching=summary.get("batching"),
        runner=summary.get("runner"), command_phases_s=summary.get("command_phases_s"), stages={k: round(v.get("total_ms", 0)) for k, v in summary["timing"]["stages"].items()},
        padding_efficiency=summary["tokens"].get("padding_efficiency"), notices=summary.get("notices"),
        matmul_precision=summary.get("model", {}).get("matmul_precision"),
    )
    table = pq.read_table(os.path.join(out, "scores", "run_id=r"), columns=["doc_id", "embedding", "n_chunks", "attention_impl"])
    order = np.argsort([int(d[1:]) for d in table.column("doc_id").to_pylist()])
    record["embeddings"] = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))[order]
    record["single_window"] = (np.asarray(table.column("n_chunks"))[order] == 1)
    record["attention_impl"] = sorted(set(table.column("attention_impl").to_pylist()))
    return record


def tokenizer_rates(config_dir: str, texts: list[str]) -> dict:
    """The MiniLM tokenizer's documents per second on this host: one batch encode of everything, batches of
    256 in a row, and batches of 256 from 4 threads (as parallel bundles call it)."""
    from concurrent.futures import ThreadPoolExecutor

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(os.path.join(config_dir, "tokenizer.json"))
    chunks = [texts[i:i + 256] for i in range(0, len(texts), 256)]
    rates = {}
    for name, work in (("one_batch", lambda: tokenizer.encode_batch_fast(texts, add_special_tokens=False)),
                       ("batches_256", lambda: [tokenizer.encode_batch_fast(c, add_special_tokens=False) for c in chunks]),
                       ("batches_256_4_threads", lambda: list(ThreadPoolExecutor(4).map(
                           lambda c: tokenizer.encode_batch_fast(c, add_special_tokens=False), chunks)))):
        start = time.perf_counter()
        work()
        rates[name] = round(len(texts) / (time.perf_counter() - start))
    return rates


def cosines(a, b):
    import numpy as np

    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True, help="JSONL(.gz) with id and text, ids d0, d1, ...")
    parser.add_argument("--hf_config", required=True, help="MiniLM's config, tokenizer and sentence-transformers files")
    parser.add_argument("--docs", type=int, default=40_000)
    parser.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp())
    parser.add_argument("--quick", action="store_true", help="one docscore setting and one peer: try the script")
    parser.add_argument("--runs", nargs="+", default=DEFAULT_RUNS, choices=sorted(RUNS),
                        help="docscore settings to run, in order (repeat one for a warm run)")
    parser.add_argument("--peers", nargs="+", default=["float32:256", "bfloat16:256", "float32:32", "bfloat16:32"],
                        help="sentence-transformers dtype:batch settings (the first float32 one is the parity reference)")
    args = parser.parse_args(argv)
    device = os.environ.get("DEVICE", "cuda")
    work = tempfile.mkdtemp(prefix="gpu_peers_")
    os.makedirs(args.out, exist_ok=True)
    results: dict = {}
    texts = read_texts(args.corpus, args.docs)
    corpus = os.path.join(work, "corpus.jsonl")
    with open(corpus, "w") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"id": f"d{i}", "text": text}) + "\n")
    log(results, args.out, "env", {**environment(device), "docs": len(texts)})

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), ROOT])),
               PYTHONUNBUFFERED="1")
    models = {"minilm": random_hf_model(args.hf_config, os.path.join(work, "hf_minilm"))}
    if not args.quick and any(RUNS[label][0] == "bert12" for label in args.runs):
        models["bert12"] = random_hf_model(args.hf_config, os.path.join(work, "hf_bert12"), BERT_BASE)
    converted = {}
    for name, hf_dir in models.items():
        converted[name] = os.path.join(work, f"ds_{name}")
        p = subprocess.run([sys.executable, "-m", "pipeline", "convert", "--hf", hf_dir, "--out", converted[name]],
                           cwd=ROOT, env=env, capture_output=True, text=True)
        log(results, args.out, f"convert_{name}", {"rc": p.returncode, "stderr": p.stderr[-1500:] if p.returncode else ""})

    peers = [(d, int(b)) for d, b in (p.split(":") for p in (["float32:256"] if args.quick else args.peers))]
    log(results, args.out, "tokenizer", tokenizer_rates(args.hf_config, texts))
    reference, best_peer = None, 0
    for dtype, batch in [p for p in peers if p[1] >= 256]:
        embeddings, record = run_peer(models["minilm"], texts, dtype, batch, device)
        if dtype == "float32" and reference is None:
            reference = embeddings
        best_peer = max(best_peer, record["docs_per_s"])
        log(results, args.out, f"st_{dtype}_bs{batch}", record)

    seen: dict[str, int] = {}
    for label in (["bf16_flash", "bf16_flash"] if args.quick else args.runs):
        model, attention, dtype, flags, cache = RUNS[label]
        cache_dir = os.path.join(work, f"jcc_{cache}")
        state = "warm" if os.path.exists(cache_dir) else "cold"
        os.makedirs(cache_dir, exist_ok=True)
        seen[label] = seen.get(label, 0) + 1
        record = run_docscore(corpus, converted[model], os.path.join(work, f"out_{label}"), attention, dtype, flags,
                              dict(env, JAX_COMPILATION_CACHE_DIR=cache_dir, **RUN_ENV.get(label, {})))
        record["cache"] = state
        embeddings, single = record.pop("embeddings", None), record.pop("single_window", None)
        if embeddings is not None and model == "minilm" and reference is not None and len(embeddings) == len(reference):
            cos = cosines(embeddings[single], reference[single])
            record.update(single_window_docs=int(single.sum()), min_cos_vs_st_f32=float(cos.min()),
                          mean_cos_vs_st_f32=float(cos.mean()))
        if record.get("docs_per_s"):
            record["x_best_peer"] = round(record["docs_per_s"] / best_peer, 3)
        log(results, args.out, f"ds_{label}_{state}_{seen[label]}", record)
        write_markdown(results, os.path.join(args.out, "gpu_peers.md"), show=False)  # a cut run keeps the table so far
    for dtype, batch in [p for p in peers if p[1] < 256]:  # small batches (its default 32) last
        log(results, args.out, f"st_{dtype}_bs{batch}", run_peer(models["minilm"], texts, dtype, batch, device)[1])
    write_markdown(results, os.path.join(args.out, "gpu_peers.md"))


def shown(value, spec: str) -> str:
    """A figure for the table; "-" where the summary has none (e.g. busy fraction with worker processes)."""
    return "-" if value is None else format(value, spec)


def write_markdown(results: dict, path: str, show: bool = True) -> None:
    env = results["env"]
    lines = [f"GPU {env['gpu']}, CPU {env['cpu']} ({env['cores']} cores), torch {env['torch']}, jax {env['jax']}, "
             f"{env['docs']} documents", "",
             "| system | cache | docs/s (whole command) | x best peer | pipeline docs/s | device busy | host us/doc | "
             "compiles cold (s) / cached | min / mean cos vs ST f32 |", "|---|---|---|---|---|---|---|---|---|"]
    for key, r in results.items():
        if key.startswith("st_"):
            lines.append(f"| sentence-transformers {key[3:]} (encode only) | | {r['docs_per_s']} | | | | | | |")
    for key, r in results.items():
        if not key.startswith("ds_"):
            continue
        if r.get("rc"):
            lines.append(f"| docscore {key[3:]} | {r.get('cache')} | failed rc={r['rc']} | | | | | | |")
            continue
        d, c = r.get("device") or {}, r.get("compile") or {}
        cos = f"{r['min_cos_vs_st_f32']:.7f} / {r['mean_cos_vs_st_f32']:.7f}" if "min_cos_vs_st_f32" in r else ""
        lines.append(
            f"| docscore {key[3:]} ({r['kernel']['resolved']}) | {r['cache']} | {r['docs_per_s']} | {r.get('x_best_peer')} | "
            f"{r['pipeline_docs_per_s']} | {shown(d.get('busy_fraction'), '.2f')} | {shown(d.get('host_us_per_doc'), '.0f')} | "
            f"{c.get('cold_count')} ({(c.get('cold_ms') or 0) / 1000:.1f}) / {c.get('cached_count')} | {cos} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    if show:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
