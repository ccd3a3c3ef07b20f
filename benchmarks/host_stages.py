"""The host work of `docscore run` per document, stage by stage: each stage's plain function over the same
documents in one process, no Beam, the model replaced by a stand-in that returns constants at once (the model
calls' own time is not host work). Set beside benchmarks/pipeline_overhead.py's Beam job with the same
stand-in, the difference is what Beam itself adds per document. Best of --rounds; CPU named. Not a test.

    .venv/bin/python benchmarks/host_stages.py --corpus corpus.jsonl.gz --docs 20000 [--batch_size 256] \
        [--host accelerator]

--host: the process-start tuning of a host whose model runs on its CPU (one malloc arena, the tokenizer on the
calling thread) or of one that drives an accelerator (glibc's arenas, the tokenizer's threads), as
benchmarks/pipeline_overhead.py's --host.

Stages: read (JSONL -> Documents), tokenize (lists of READ_CHUNK_DOCS, one batch encode each), infer
(FlaxModelHandler.run_inference on a Beam batch: packing, row filling, outputs mapped back; stand-in calls),
score (rows and DocStats), to_arrow (rows -> a pyarrow RecordBatch, as the Parquet sink does), stats (the
run-stats CombineFn's add_input of every DocStats).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", required=True, help="JSONL(.gz) records with a `text` field")
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--batch_size", type=int, default=256, help="rows per model call (--batch_size)")
    parser.add_argument("--calls_per_beam_batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--host", choices=("cpu", "accelerator"), default="cpu")
    args = parser.parse_args()
    from pipeline.process_setup import CpuTuning, accelerator_host_env, apply_cpu_tuning

    if args.host == "accelerator":
        os.environ.update(accelerator_host_env())
    apply_cpu_tuning(CpuTuning())  # first thing, as `docscore run` does

    import pyarrow as pa

    import models
    from models.loader import LoadedModel
    from pipeline.io.sources import READ_CHUNK_DOCS, ReadSpec, read_shard
    from pipeline.records import SCORES_SCHEMA
    from pipeline.stages.inference import FlaxModelHandler, ModelSpec, ScoringModel, shared_model
    from pipeline.stages.postprocess import ScoreSpec, score_documents
    from pipeline.stages.preprocess import WindowSpec, tokenize_documents
    from pipeline.telemetry.stats import RunStatsFn

    from compare_peers import environment, write_jsonl
    from gpu_peers import read_texts
    from pipeline_overhead import stand_in_start

    work = tempfile.mkdtemp(prefix="docscore-host-")
    path = os.path.join(work, "docs.jsonl")
    write_jsonl([{"id": str(i), "text": text} for i, text in enumerate(read_texts(args.corpus, args.docs))], path)
    LoadedModel.start = stand_in_start
    spec = ModelSpec("minilm-l6", attention="native", dtype="float32")
    tokenizer = models.load_tokenizer(spec.name)
    window_spec = WindowSpec(max_len=256, stride=0, max_chunks=8)
    handler = FlaxModelHandler(spec, task="embed", max_len=256, batch_size=args.batch_size,
                               calls_per_beam_batch=args.calls_per_beam_batch, kernel="xla", min_row_len=256)
    model = ScoringModel(loaded=shared_model(spec), backend="cpu")
    score_spec = ScoreSpec(task="embed", run_id="host")
    beam_batch_tokens = args.batch_size * 256 * args.calls_per_beam_batch

    def run_once() -> tuple[dict[str, float], int]:
        seconds: dict[str, float] = {}

        def timed(name, fn, *a):
            start = time.perf_counter()
            result = fn(*a)
            seconds[name] = time.perf_counter() - start
            return result

        docs = timed("read", lambda: list(read_shard(path, ReadSpec())))
        chunks = [docs[i:i + READ_CHUNK_DOCS] for i in range(0, len(docs), READ_CHUNK_DOCS)]
        tokenized = timed("tokenize", lambda: [tokenize_documents(c, tokenizer, window_spec, with_query=False) for c in chunks])
        batches, batch, tokens = [], [], 0  # Beam batches of whole chunks, by tokens, as RunInference's batching
        for chunk in tokenized:
            batch.append(chunk)
            tokens += sum(len(w) for d in chunk for w in d.windows)
            if tokens >= beam_batch_tokens:
                batches.append(batch)
                batch, tokens = [], 0
        batches += [batch] if batch else []
        results = timed("infer", lambda: [r for b in batches for r in handler.run_inference(b, model)])
        scored = timed("score", lambda: [score_documents(score_spec, r.example, r.inference) for r in results])
        timed("to_arrow", lambda: [pa.RecordBatch.from_pylist(rows, schema=SCORES_SCHEMA) for rows, _, _ in scored])
        stats_fn = RunStatsFn("embed")

        def add_stats():
            acc = stats_fn.create_accumulator()
            for _, stats, _ in scored:
                for s in stats:
                    acc = stats_fn.add_input(acc, ("doc", s))
            return acc

        timed("stats", add_stats)
        return seconds, len(docs)

    handler.run_inference([tokenize_documents(list(read_shard(path, ReadSpec()))[:64], tokenizer, window_spec,
                                              with_query=False)], model)  # the handler's lazy state, made once
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        seconds, n = run_once()
        best = {k: min(v, best.get(k, v)) for k, v in seconds.items()}
    print(f"{n} documents of {args.corpus}, batch_size {args.batch_size}, {args.calls_per_beam_batch} calls per Beam batch, {args.host} host; "
          f"{environment()['cpu']}; best of {args.rounds} rounds, us per document:")
    for name, s in best.items():
        print(f"  {name:10} {1e6 * s / n:7.1f}")
    print(f"  {'all':10} {1e6 * sum(best.values()) / n:7.1f}")


if __name__ == "__main__":
    main()
