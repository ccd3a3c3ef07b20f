"""What `docscore run` costs besides the model: each phase of one run, timed, on the compare_peers documents.

Phases: validate (includes the model load), build_pipeline (the Beam graph), the Beam job (read ->
Parquet), write_derived (history row and HTML report, matplotlib import included), and the model calls;
compile_s: the part of the model calls spent tracing, lowering and compiling (or loading from JAX's
compilation cache: every round after the first finds it warm), from the run's summary; job_gc_s and
job_gc_full_s: time in Python's cyclic garbage collector during the Beam job (all collections / full ones).
imports: from the process's start to docscore's modules imported; exit: from the run's end to the process gone
(`--exit frozen` freezes the garbage collector first, as the `docscore` command does, pipeline/cli.py entry;
`--exit collected` lets the interpreter's shutdown rescan every object); process: the whole process.
With --model stand_in, LoadedModel.start (every model call) returns constants at once instead of running the model, so
the job's time is Beam and docscore's own per-document work (the outputs are meaningless; this measures
time only). --device_us_per_row N makes the stand-in an accelerator: each call's constants come from a simulated
device, one thread that takes the calls in order and sleeps N us per row of the call (without the GIL, using no
CPU), and reading a result waits for its call as np.asarray of a JAX array does; rows are then packed as on an
accelerator (pipeline/stages/batching.py: rows of --max_seq_len only, full-size calls only); device_busy_s is its total and
busy the share of the Beam job it was computing (an H200 ran MiniLM's rows of 256 tokens in ~75 us each:
benchmarks/RESULTS.md, "GPU end to end"; a 12-layer BERT-base does ~8x the arithmetic). With --direct_running_mode multi_processing
in --flags, Beam's worker processes run the stand-in too (a sitecustomize.py on their PYTHONPATH patches
models.loader as it is imported) and their simulated devices take turns under one file lock: one device shared by
the processes, as on a one-GPU host; only documents/s is reported then. One fresh process per round; each phase's
fastest round is printed. Not a test.

    .venv/bin/python benchmarks/pipeline_overhead.py --model stand_in
    .venv/bin/python benchmarks/pipeline_overhead.py --model real --dtype bfloat16
    .venv/bin/python benchmarks/pipeline_overhead.py --corpus corpus.jsonl.gz --docs 20000 \
        --flags "--batch_size 256 --calls_per_beam_batch 4" --host accelerator  # a GPU host's host work

--corpus reads JSONL(.gz) records with a `text` field (e.g. the GPU recipe's corpus) instead of the help
pages (~1,900 paragraphs); --flags are added to the `docscore run` command line.
"""
from __future__ import annotations

import argparse
import functools
import gc
import json
import shlex
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
PHASES = ("validate", "build_pipeline", "run_with_progress", "write_derived")


def stand_in_start(loaded, method, input_ids, segment_ids, *static):
    """In place of LoadedModel.start: one constant of the output's shape at once (embed_packed: [rows, slots, hidden],
    unit vectors; token_logprobs: [rows, len], -1 each), so what is timed around it is host work only. Not zeros:
    docscore makes an embedding of zeros an error row, which is scored by other code."""
    import numpy as np

    hidden = loaded.config.hidden_size
    if method == "embed_packed":
        return np.full((input_ids.shape[0], static[0], hidden), hidden ** -0.5, np.float32)
    return np.full(input_ids.shape, -1.0, np.float32)


class SimulatedDevice:
    """An accelerator's timing without one: calls queue in order on one thread, which sleeps `us_per_row` per
    row of each (the GIL released, no CPU used); a call's result is ready when its turn ends. With `lock_path`,
    each call holds an exclusive flock on that file while it runs: the devices of several processes are one."""

    def __init__(self, us_per_row: float, lock_path: str | None = None):
        import queue
        import threading

        self.us_per_row, self.busy_s, self._lock_path = us_per_row, 0.0, lock_path
        self.turns: list[tuple[float, float]] = []  # when each call ran (time.time())
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, daemon=True, name="simulated-device").start()

    def _run(self) -> None:
        import fcntl

        lock = open(self._lock_path, "a") if self._lock_path else None  # noqa: SIM115 - held for the thread's life
        while True:
            seconds, done = self._calls.get()
            if lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
            began = time.time()
            time.sleep(seconds)
            self.turns.append((began, time.time()))
            if lock:
                fcntl.flock(lock, fcntl.LOCK_UN)
            self.busy_s += seconds
            done.set()

    def start(self, output):
        """`output` as the result of a call of its rows, readable (np.asarray) once the device has run it."""
        import threading

        done = threading.Event()
        self._calls.put((output.shape[0] * self.us_per_row / 1e6, done))
        return SimulatedResult(output, done)


class SimulatedResult:
    """A call's output that np.asarray waits for, as for a JAX array still being computed."""

    def __init__(self, output, done):
        self._output, self._done = output, done

    def __array__(self, dtype=None, copy=None):
        self._done.wait()
        return self._output if dtype is None else self._output.astype(dtype, copy=False)


STAND_IN_ENV = "DOCSCORE_BENCH_STAND_IN"  # "us_per_row lock_path": Beam's worker processes run the stand-in
WORKER_SITECUSTOMIZE = f'''# written by benchmarks/pipeline_overhead.py: this process runs the stand-in model (not docscore code)
import os, sys
if os.environ.get({STAND_IN_ENV!r}):
    import importlib.abc, importlib.util

    class _AfterLoaderImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name != "models.loader":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            load = spec.loader.exec_module

            def exec_module(module):
                load(module)
                sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
                import pipeline_overhead
                pipeline_overhead.install_stand_in(module.LoadedModel, os.environ[{STAND_IN_ENV!r}])

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _AfterLoaderImport())
'''


def stand_in(device: SimulatedDevice | None):
    """LoadedModel.start's stand-in: its constants at once, or from `device` once it has run the call."""
    def start(self, method, input_ids, segment_ids, *static):
        out = stand_in_start(self, method, input_ids, segment_ids, *static)
        return out if device is None else device.start(out)

    return start


def install_stand_in(loaded_model_class, setting: str) -> None:
    """In a Beam worker process: LoadedModel.start as the stand-in's, on a simulated device shared through the
    lock file (`setting`: STAND_IN_ENV's value)."""
    us_per_row, lock_path = setting.split(" ", 1)
    loaded_model_class.start = stand_in(SimulatedDevice(float(us_per_row), lock_path) if float(us_per_row) else None)


def stand_in_in_workers(args) -> None:
    """With multi_processing in --flags: Beam's worker processes (which inherit this environment) start with a
    sitecustomize.py that installs the stand-in, and one lock file makes their simulated devices one."""
    work = tempfile.mkdtemp(prefix="docscore-overhead-workers-")
    with open(os.path.join(work, "sitecustomize.py"), "w") as f:
        f.write(WORKER_SITECUSTOMIZE)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [work, os.environ.get("PYTHONPATH")]))
    os.environ[STAND_IN_ENV] = f"{args.device_us_per_row} {os.path.join(work, 'device.lock')}"


def child(args) -> dict[str, float]:
    from pipeline.process_setup import CpuTuning, apply_cpu_tuning

    apply_cpu_tuning(CpuTuning(dtype=args.dtype))
    import numpy as np

    import pipeline.launch
    import pipeline.runs.publish
    import pipeline.telemetry.progress
    from models.loader import LoadedModel

    born = pipeline.launch.process_start_time()  # the command's own clock (summary.json's command_wall_s)
    seconds: dict[str, float] = {"imports": time.time() - born, "model_calls": 0.0}
    running: set[str] = set()  # the phases under way
    owners = (pipeline.launch, pipeline.launch, pipeline.telemetry.progress, pipeline.runs.publish)
    for module, name in zip(owners, PHASES):
        def timed(*a, _f=getattr(module, name), _name=name, **k):
            start = time.perf_counter()
            running.add(_name)
            try:
                return _f(*a, **k)
            finally:
                seconds[_name] = time.perf_counter() - start
                running.discard(_name)
        setattr(module, name, functools.wraps(getattr(module, name))(timed))
    real_start = LoadedModel.start  # every model call of the pipeline goes through it (dispatch; results read later)
    device = SimulatedDevice(args.device_us_per_row) if args.device_us_per_row else None
    if device is not None:  # the run plans its rows as a GPU's (the plan travels to worker processes in the job)
        from pipeline.stages import batching

        batching.MIN_ROW_LEN["cpu"], batching.TAIL_CALL_FRACTION["cpu"] = batching.MIN_ROW_LEN["gpu"], batching.TAIL_CALL_FRACTION["gpu"]
    if args.model == "stand_in" and "multi_processing" in args.flags:
        stand_in_in_workers(args)

    fake_start = stand_in(device)

    def start(self, method, input_ids, segment_ids, *static):
        begin = time.perf_counter()
        if args.model == "stand_in" or device is not None:
            out = fake_start(self, method, input_ids, segment_ids, *static)
        else:
            out = np.asarray(real_start(self, method, input_ids, segment_ids, *static))  # waits: model time counted here
        seconds["model_calls"] += time.perf_counter() - begin
        return out

    LoadedModel.start = start
    seconds.update(job_gc_s=0.0, job_gc_full_s=0.0)
    collection_started = [0.0]

    def time_collections(phase, info):
        if phase == "start":
            collection_started[0] = time.perf_counter()
        elif "run_with_progress" in running:
            took = time.perf_counter() - collection_started[0]
            seconds["job_gc_s"] += took
            seconds["job_gc_full_s"] += took if info["generation"] == 2 else 0.0

    gc.callbacks.append(time_collections)
    start = time.perf_counter()
    code = pipeline.launch.main(["--input", args.input, "--output", args.output, "--task", "embed", "--attention", args.attention,
                              "--dtype", args.dtype, "--max_seq_len", "256", "--batch_size", "16", "--run_id", "overhead",
                              "--no_progress", *shlex.split(args.flags)])
    if code:
        raise SystemExit(f"docscore run exited {code}")
    command = time.perf_counter() - start
    with open(os.path.join(args.output, "runs", "run_id=overhead", "summary.json")) as f:
        seconds["compile_s"] = json.load(f)["compile"]["time_ms"] / 1000.0
    if device is not None:
        seconds["device_busy_s"] = device.busy_s
    return {"command": command, **seconds, "born_at": born, "ended_at": time.time()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("stand_in", "real"), default="stand_in")
    parser.add_argument("--docs", type=int, default=1891, help="documents (default: the help pages' 1,891 paragraphs)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--attention", default="native")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--corpus", help="JSONL(.gz) records with a `text` field (default: the help pages)")
    parser.add_argument("--flags", default="", help="more `docscore run` flags, one string (later flags win)")
    parser.add_argument("--exit", choices=("frozen", "collected"), default="frozen",
                        help="how the process ends after the run (see above)")
    parser.add_argument("--host", choices=("cpu", "accelerator"), default="cpu",
                        help="the process-start tuning of a host whose model runs on its CPU (one malloc arena, the "
                             "tokenizer on the calling thread) or that drives an accelerator (glibc's arenas, the "
                             "tokenizer's threads): with --model stand_in, accelerator is a GPU host's host work")
    parser.add_argument("--device_us_per_row", type=float, default=0.0,
                        help="with --model stand_in: a simulated accelerator that computes each row of a call in this "
                             "many microseconds, one call at a time (see above)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device_us_per_row and args.model != "stand_in":
        parser.error("--device_us_per_row simulates the device of --model stand_in; the real model runs on this machine's")
    if args.child:
        print(json.dumps(child(args)), flush=True)
        if args.exit == "frozen":
            gc.freeze()
        return
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from compare_peers import load_documents, write_jsonl
    from gpu_peers import read_texts

    work = tempfile.mkdtemp(prefix="docscore-overhead-")
    if args.corpus:
        docs = [{"id": str(i), "text": text} for i, text in enumerate(read_texts(args.corpus, args.docs))]
    else:
        docs = load_documents(args.docs)
    path = os.path.join(work, "docs.jsonl")
    write_jsonl(docs, path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "TOKENIZERS_PARALLELISM"}
    if args.host == "accelerator":
        from pipeline.process_setup import accelerator_host_env

        env.update(accelerator_host_env())
    best: dict[str, float] = {}
    for k in range(args.rounds):
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--model", args.model, "--dtype", args.dtype,
                               "--attention", args.attention, "--input", path, "--output", os.path.join(work, f"out{k}"),
                               "--flags=" + args.flags, "--exit", args.exit, "--device_us_per_row", str(args.device_us_per_row)],
                              env=env, capture_output=True, text=True)
        if done.returncode:  # the child's own words (a docscore run refusal, a traceback), not CalledProcessError's
            sys.exit(f"round {k + 1}: the run exited {done.returncode}:\n{done.stderr[-4000:]}")
        gone = time.time()
        seconds = json.loads(done.stdout.strip().splitlines()[-1])
        seconds.update(exit=gone - seconds.pop("ended_at"), process=gone - seconds.pop("born_at"))
        print(f"round {k + 1}: " + ", ".join(f"{name} {s:.2f} s" for name, s in seconds.items()), flush=True)
        best = {name: min(s, best.get(name, s)) for name, s in seconds.items()}
    print(f"{len(docs)} documents, model {args.model}, {args.dtype}, {args.attention}, exit {args.exit}, {args.host} host; "
          f"fastest of {args.rounds} rounds:")
    for name, s in best.items():
        print(f"  {name:18} {s:6.2f} s")
    if "multi_processing" in args.flags:
        print(f"  {len(docs) / best['run_with_progress']:.0f} documents/s (worker processes: no busy share or host "
              "time per document)")
        return
    if args.device_us_per_row:
        print(f"  simulated device busy {best['device_busy_s'] / best['run_with_progress']:.2f} of the Beam job; "
              f"{len(docs) / best['run_with_progress']:.0f} documents/s")
        return
    other = best["run_with_progress"] - best["model_calls"]
    print(f"  Beam job minus model calls: {other:.2f} s ({1000 * other / len(docs):.2f} ms per document)")


if __name__ == "__main__":
    main()
