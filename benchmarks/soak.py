"""Soak benchmark (not CI): many short documents through `docscore run` on the DirectRunner while memory
is watched twice - by the job itself (pipeline/telemetry/memory.py: RSS per inference batch -> summary.json memory)
and by an outside sampler of the processes' RSS every --sample_s seconds. Reports the RSS growth after
warm-up (the goal: < 5%) next to the environment.

    .venv/bin/python benchmarks/soak.py [--docs 20000] [--shards 20] [--workers 1] [--batch_size 1] [--out DIR]
    .venv/bin/python benchmarks/soak.py --control [--docs 20000]   # the same documents without Beam

Inference runs in worker processes (--direct_running_mode multi_processing) so that the worker RSS
is that of the model and its batches alone: the launcher process is Beam's runner, which holds every
stage's output in memory by design, so its RSS grows with the corpus and is reported apart.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("a short document about the weather the markets a football match a new phone a recipe for bread "
         "the history of a small town and a review of a film that nobody watched").split()


def write_corpus(root: str, docs: int, shards: int) -> None:
    """`docs` short documents (5-18 words: 16- and 32-token rows, deterministic) over `shards` JSONL shards."""
    os.makedirs(root, exist_ok=True)
    per = -(-docs // shards)
    for s in range(shards):
        with open(os.path.join(root, f"shard-{s:03d}.jsonl"), "w", encoding="utf-8") as f:
            for i in range(s * per, min(docs, (s + 1) * per)):
                n = 5 + (i * 7) % 14
                text = " ".join(WORDS[(i + 3 * k) % len(WORDS)] for k in range(n))
                f.write(json.dumps({"id": f"d{i}", "text": f"{text} ({i})"}) + "\n")


class Sampler(threading.Thread):
    """RSS (MB) of a process and, separately, of its children (the Beam workers), every interval_s."""

    def __init__(self, pid: int, interval_s: float):
        super().__init__(daemon=True)
        self.process, self.interval_s = psutil.Process(pid), interval_s
        self.samples: list[tuple[float, float, dict[int, float]]] = []  # (t, launcher MB, {worker pid: MB})
        self.stopped = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        while not self.stopped.is_set():
            try:
                launcher = self.process.memory_info().rss / 2**20
                workers = {}
                for child in self.process.children(recursive=True):
                    try:
                        workers[child.pid] = child.memory_info().rss / 2**20
                    except psutil.NoSuchProcess:
                        pass
            except psutil.NoSuchProcess:
                return
            self.samples.append((time.monotonic() - start, launcher, workers))
            self.stopped.wait(self.interval_s)


def growth_after_warmup(series: list[tuple[float, float]], warmup_fraction: float = 0.2, window_fraction: float = 0.1) -> dict:
    """(t, MB) samples -> the median of the window right after warm-up vs the median of the last window."""
    if len(series) < 20:
        return {"samples": len(series), "growth_pct": None}
    n = len(series)
    start = int(n * warmup_fraction)
    width = max(3, int(n * window_fraction))
    warm = statistics.median(mb for _, mb in series[start:start + width])
    end = statistics.median(mb for _, mb in series[-width:])
    return {"samples": n, "warm_mb": round(warm, 1), "end_mb": round(end, 1), "peak_mb": round(max(mb for _, mb in series), 1),
            "growth_pct": round(100 * (end - warm) / warm, 2)}


def control_loop(docs: int, batch_docs: int = 200, every: int = 5) -> dict:
    """The control: the same documents through FlaxModelHandler.run_inference in this process, without
    Beam, in batches of `batch_docs` documents; RSS after every batch (every `every`-th shown). Flat
    here and growing in the job would point at the runner, not at the model path."""
    sys.path.insert(0, ROOT)
    from pipeline.records import Document
    from pipeline.stages.inference import FlaxModelHandler, ModelSpec
    from pipeline.stages.preprocess import WindowSpec, tokenize_documents

    handler = FlaxModelHandler(ModelSpec("minilm-l6", attention="native"), task="embed", max_len=256, batch_size=16,
                               calls_per_beam_batch=32, kernel="xla")
    model = handler.load_model()
    spec = WindowSpec(max_len=256, stride=32, max_chunks=8)
    series, process, start = [], psutil.Process(), time.monotonic()
    for first in range(0, docs, batch_docs):
        batch = []
        for i in range(first, min(docs, first + batch_docs)):
            n = 5 + (i * 7) % 14  # as write_corpus
            text = " ".join(WORDS[(i + 3 * k) % len(WORDS)] for k in range(n)) + f" ({i})"
            batch.append(Document(f"d{i}", text, "control", i))
        handler.run_inference([tokenize_documents(batch, model.loaded.tokenizer, spec, with_query=False)], model)
        series.append((time.monotonic() - start, process.memory_info().rss / 2**20))
    return {"docs": docs, "batches": -(-docs // batch_docs), **growth_after_warmup(series),
            "series_mb": [round(mb, 1) for _, mb in series[::every]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--workers", type=int, default=1, help="--direct_num_workers")
    parser.add_argument("--batch_size", type=int, default=None,
                        help="docscore's --batch_size (default: docscore's). A Beam batch holds 32 calls' worth of "
                             "tokens, so at the default 20,000 short documents are only ~3 batches; 1 gives ~36")
    parser.add_argument("--sample_s", type=float, default=0.5)
    parser.add_argument("--out", default=None, help="where to keep the corpus, tables and soak.json (default: a temporary directory)")
    parser.add_argument("--control", action="store_true", help="only the control loop without Beam (see control_loop)")
    args = parser.parse_args()
    if args.control:
        print(json.dumps({"control_without_beam": control_loop(args.docs), "load_avg": [round(x, 2) for x in os.getloadavg()]}, indent=2))
        return

    root = args.out or tempfile.mkdtemp(prefix="docscore-soak-")
    corpus, output = os.path.join(root, "in"), os.path.join(root, "out")
    write_corpus(corpus, args.docs, args.shards)
    command = [sys.executable, "-m", "pipeline", "run", "--input", corpus, "--output", output, "--run_id", "soak",
               "--attention", "native", "--no_progress", "--direct_running_mode", "multi_processing",
               "--direct_num_workers", str(args.workers)] + (["--batch_size", str(args.batch_size)] if args.batch_size else [])
    load_before = os.getloadavg()
    started = time.monotonic()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = Sampler(proc.pid, args.sample_s)
    sampler.start()
    log, _ = proc.communicate()
    sampler.stopped.set()
    sampler.join()
    wall_s = time.monotonic() - started
    if proc.returncode != 0:
        print(log[-4000:])
        raise SystemExit(f"docscore run exited {proc.returncode}")
    with open(os.path.join(output, "runs", "run_id=soak", "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)

    # the outside view: the largest worker process (the one the model runs in) and the launcher
    worker_series = [(t, max(w.values())) for t, _, w in sampler.samples if w and max(w.values()) > 300]
    launcher_series = [(t, mb) for t, mb, _ in sampler.samples]
    result = {
        "docs": args.docs,
        "scored": summary["counts"]["scored"],
        "wall_s": round(wall_s, 1),
        "docs_per_s": round(summary["throughput"]["docs_per_s"], 1),
        "job_memory": summary["memory"],  # per-batch samples inside the job (warm = batch 20)
        "worker_rss_outside": growth_after_warmup(worker_series),
        "launcher_rss_outside": growth_after_warmup(launcher_series),
        "worker_rss_series": [(round(t, 1), round(mb, 1)) for t, mb in worker_series[:: max(1, len(worker_series) // 60)]],
        "command": " ".join(command[1:]),
        "environment": {
            "python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine(),
            "load_avg_before": [round(x, 2) for x in load_before], "load_avg_after": [round(x, 2) for x in os.getloadavg()],
            "versions": {k: summary["versions"].get(k) for k in ("jax", "apache-beam", "flax")},
        },
    }
    with open(os.path.join(root, "soak.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))
    job_growth = summary["memory"].get("growth_after_warmup_pct")
    outside = result["worker_rss_outside"]["growth_pct"]
    print(f"\nworker RSS growth after warm-up: job's own samples {job_growth if job_growth is None else round(job_growth, 2)}%, "
          f"outside sampler {outside}% (goal < 5%); launcher (Beam runner buffers, grows with the corpus) "
          f"{result['launcher_rss_outside']['growth_pct']}%")


if __name__ == "__main__":
    main()
