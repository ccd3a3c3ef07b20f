"""The host side of the model loop: calls dispatched before results are read, parallel bundles giving the
same outputs as one thread, the device busy clock, and the per-backend batch settings."""
from __future__ import annotations

import dataclasses

import threading
import time

import numpy as np
import pytest

from pipeline.records import Batch
from pipeline.runs.summary import COMMAND_PHASES
from pipeline.stages import batching
from pipeline.stages.packing import max_segments_for, run_packed
from pipeline.telemetry.device_time import BusyClock
from tests.conftest import SENTENCES, TEST_MAX_LEN, common_flags, read_summary, read_table, run_docscore, write_jsonl


class PendingResult:
    """Stands for a device array still being computed: np.asarray is the moment the host waits for it."""

    def __init__(self, value: np.ndarray, events: list[str], name: str):
        self._value, self._events, self._name = value, events, name

    def __array__(self, dtype=None, copy=None):
        self._events.append(f"read {self._name}")
        return self._value if dtype is None else self._value.astype(dtype)


def test_run_packed_dispatches_every_call_before_reading_any_result():
    """The host fills and dispatches the next call while the device computes: no call's result is read
    before the last call is dispatched, and the outputs are those of the plain (synchronous) loop."""
    rng = np.random.default_rng(0)
    windows = [rng.integers(1, 1000, size=int(n)).astype(np.int32) for n in rng.integers(3, 64, size=40)]
    events: list[str] = []

    def per_segment(ids, seg):  # slot s of each row: [sum of segment s+1's ids, its length]
        out = np.zeros((ids.shape[0], max_segments_for(ids.shape[1]), 2), np.float32)
        for r in range(ids.shape[0]):
            for s in range(out.shape[1]):
                mask = seg[r] == s + 1
                out[r, s] = [ids[r][mask].sum(), mask.sum()]
        return out

    def pending(ids, seg):
        name = f"call {sum(e.startswith('dispatch') for e in events)}"
        events.append(f"dispatch {name}")
        return PendingResult(per_segment(ids, seg), events, name)

    outputs, costs, totals = run_packed(windows, pending, max_len=64, batch_size=4)
    dispatches = [i for i, e in enumerate(events) if e.startswith("dispatch")]
    reads = [i for i, e in enumerate(events) if e.startswith("read")]
    assert totals["calls"] == len(dispatches) == len(reads) > 1
    assert max(dispatches) < min(reads)
    plain, plain_costs, plain_totals = run_packed(windows, per_segment, max_len=64, batch_size=4)
    for got, want, window in zip(outputs, plain, windows):
        np.testing.assert_array_equal(got, want)
        assert got.tolist() == [float(window.sum()), float(len(window))]
    assert [c.computed_tokens_per_row for c in costs] == [c.computed_tokens_per_row for c in plain_costs]
    assert sum(c.ms_per_row for c in costs) == pytest.approx(totals["ms"], rel=1e-6)


def test_busy_clock_counts_overlapping_batches_once():
    """Batches of several threads in flight at once count once: the clock adds the union of the intervals."""
    now = [0.0]
    clock = BusyClock(now=lambda: now[0])
    first, second = clock.busy(), clock.busy()
    first.__enter__()  # t=0: batch A starts
    now[0] = 2.0
    second.__enter__()  # t=2: batch B starts while A runs
    now[0] = 3.0
    first.__exit__(None, None, None)  # t=3: A ends, B still in flight
    assert clock.take_new_seconds() == 0.0  # nothing completed yet: the interval is still open
    now[0] = 5.0
    second.__exit__(None, None, None)  # t=5: B ends
    assert clock.take_new_seconds() == 5.0  # 0..5 once, not 3 + 3
    assert clock.take_new_seconds() == 0.0  # each second is handed out once
    now[0] = 9.0
    with clock.busy():  # idle 5..9 is not counted
        now[0] = 10.0
    assert clock.take_new_seconds() == 1.0


def test_busy_clock_leaves_out_a_threads_compiling_unless_another_thread_is_busy():
    now = [0.0]
    clock = BusyClock(now=lambda: now[0])
    with clock.idle():  # outside any batch: changes nothing
        now[0] = 1.0
    assert clock.take_new_seconds() == 0.0
    with clock.busy():  # t=1..10: a batch that compiles for 5 s of it
        now[0] = 3.0
        with clock.idle():
            now[0] = 8.0
        now[0] = 10.0
    assert clock.take_new_seconds() == 4.0
    other = clock.busy()
    other.__enter__()  # t=10: another thread's batch in flight
    with clock.busy():
        with clock.idle():  # this thread compiles t=10..15 while the other batch runs: busy all along
            now[0] = 15.0
    now[0] = 16.0
    other.__exit__(None, None, None)
    assert clock.take_new_seconds() == 6.0


@pytest.mark.integration
def test_a_model_call_that_compiles_counts_only_its_run_as_device_busy(minilm):
    """The pipeline's models (shared_model) leave their compiling out of the process's busy clock: the
    device waits while the host compiles."""
    from pipeline.telemetry.device_time import PROCESS_CLOCK

    ids = np.ones((3, 40), np.int32)  # a shape no other test compiles
    PROCESS_CLOCK.take_new_seconds()
    before = minilm.compiles_by_this_thread()
    t0 = time.perf_counter()
    with PROCESS_CLOCK.busy():
        np.asarray(minilm.start("embed_packed", ids, ids, 1))
    wall = time.perf_counter() - t0
    count, seconds, *_ = minilm.compiles_by_this_thread() - before
    assert count == 1 and seconds > 0.005
    assert PROCESS_CLOCK.take_new_seconds() <= wall - seconds + 1e-3
    with PROCESS_CLOCK.busy():  # compiled now: the whole call is busy time
        np.asarray(minilm.start("embed_packed", ids, ids, 1))
    assert minilm.compiles_by_this_thread()[0] == before[0] + 1
    assert PROCESS_CLOCK.take_new_seconds() > 0


@pytest.mark.integration
def test_a_thread_waiting_for_another_threads_compile_is_not_device_busy(minilm):
    """A batch whose shape is not compiled yet waits while another thread compiles (here: the test holds the
    model's compile lock for 0.3 s), then compiles its own: neither is device time (accelerator runs use 4
    threads, and a GPU compile takes tens of seconds)."""
    from pipeline.telemetry.device_time import PROCESS_CLOCK

    ids = np.ones((7, 40), np.int32)  # a shape no other test compiles
    spans = []

    def batch() -> None:
        before, t0 = minilm.compiles_by_this_thread(), time.perf_counter()
        with PROCESS_CLOCK.busy():
            np.asarray(minilm.start("embed_packed", ids, ids, 1))
        spans.append((time.perf_counter() - t0, minilm.compiles_by_this_thread() - before))

    PROCESS_CLOCK.take_new_seconds()
    thread = threading.Thread(target=batch)
    with minilm._lock:  # another thread's compile in progress
        thread.start()
        thread.join(timeout=0.3)
    thread.join()
    [(wall, (count, seconds, *_))] = spans
    assert count == 1 and wall > 0.3 + seconds
    assert PROCESS_CLOCK.take_new_seconds() <= wall - 0.3 - seconds + 0.02


def test_busy_clock_is_safe_across_threads():
    """Many threads entering and leaving at once leave the clock idle again: a later batch alone adds
    exactly its own time."""
    ticks = iter(range(10**9))
    now = {"fixed": None}
    clock = BusyClock(now=lambda: now["fixed"] if now["fixed"] is not None else float(next(ticks)))

    def batches():
        for _ in range(200):
            with clock.busy():
                pass

    threads = [threading.Thread(target=batches) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    clock.take_new_seconds()
    now["fixed"] = 10.0**9
    with clock.busy():
        now["fixed"] += 7.0
    assert clock.take_new_seconds() == 7.0


def test_batch_settings_per_backend_and_the_flags_that_override_them():
    cpu, gpu = batching.settings_for("cpu"), batching.settings_for("gpu")
    assert (cpu.batch_size, cpu.calls_per_beam_batch, cpu.local_threads, cpu.shortest_row(256)) == (16, 32, 1, 64)
    assert (gpu.batch_size, gpu.local_threads, gpu.shortest_row(256)) == (256, 2, 256)  # one row length
    assert (cpu.tail_call_fraction, gpu.tail_call_fraction) == (8, 1)  # an accelerator: full-size calls only
    assert gpu.summary(256)["beam_batch_tokens"] == 256 * 256 * gpu.calls_per_beam_batch
    assert gpu.summary(256)["tail_call_fraction"] == 1
    mine = batching.settings_for("gpu", batch_size=64, calls_per_beam_batch=2)
    assert (mine.batch_size, mine.calls_per_beam_batch) == (64, 2)
    with pytest.raises(ValueError, match="--calls_per_beam_batch=0"):
        batching.settings_for("tpu", calls_per_beam_batch=0)


def test_the_handlers_beam_batch_holds_its_batch_settings_tokens():
    from pipeline.stages.inference import FlaxModelHandler, ModelSpec

    settings = batching.settings_for("gpu", batch_size=8, calls_per_beam_batch=3)
    handler = FlaxModelHandler(ModelSpec("minilm-l6"), task="embed", max_len=64, batch_size=settings.batch_size,
                               calls_per_beam_batch=settings.calls_per_beam_batch, kernel="xla")
    kwargs = handler.batch_elements_kwargs()
    assert kwargs["min_batch_size"] == kwargs["max_batch_size"] == settings.beam_batch_tokens(64) == 8 * 64 * 3


def test_what_the_task_compiled_at_load_is_taken_by_one_thread_only():
    """Threads sharing a model: one batch adds the load's compiles to its metrics, the others add nothing."""
    from pipeline.stages.inference import ScoringModel

    at_load = np.array([2.0, 1.5, 0.0, 0.0])
    model = ScoringModel(loaded=None, backend="cpu", load_compiles=at_load)
    taken, start = [], threading.Barrier(8)

    def take():
        start.wait()
        taken.append(model.take_load_compiles())

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = [t for t in taken if t is not None]
    assert len(taken) == 8 and len(got) == 1 and got[0] is at_load
    assert model.take_load_compiles() is None


def test_local_threads_apply_only_when_no_direct_flag_was_given():
    from apache_beam.options.pipeline_options import DirectOptions

    from pipeline.launch import use_local_threads
    from pipeline.options import given_option_names, parse_options

    argv = ["--input", "x.jsonl", "--output", "out"]
    for runner in ([], ["--runner", "direct"]):  # Beam's spellings of the DirectRunner
        options, _ = parse_options(argv + runner)
        assert use_local_threads(options, 4, given_option_names(argv + runner)) == 4
        direct = options.view_as(DirectOptions)
        assert (direct.direct_running_mode, direct.direct_num_workers) == ("multi_threading", 4)
    # the user's choice stands, and the parallel bundles returned (the summary's batching.local_threads) are its
    for flags, bundles in ((["--direct_num_workers", "1"], 1), (["--direct_running_mode", "in_memory"], 1),
                           (["--direct_running_mode", "in_memory", "--direct_num_workers", "3"], 3),  # Beam's threads
                           (["--direct_num_workers", "2"], 2),  # in-memory mode: 2 bundles at once (it said 1)
                           (["--direct_running_mode", "multi_processing", "--direct_num_workers", "2"], 2),
                           (["--direct_running_mode", "multi_threading", "--direct_num_workers", "3"], 3)):
        chosen = argv + flags
        options, _ = parse_options(chosen)
        assert use_local_threads(options, 4, given_option_names(chosen)) == bundles, flags
        assert options.view_as(DirectOptions).direct_running_mode == dict(zip(flags[::2], flags[1::2])).get(
            "--direct_running_mode", "in_memory")
    options, _ = parse_options(argv)
    assert use_local_threads(options, 1, set()) == 1  # a CPU run's default: Beam's in-memory runner
    assert options.view_as(DirectOptions).direct_running_mode == "in_memory"
    remote = argv + ["--runner", "DataflowRunner"]
    options, _ = parse_options(remote)
    use_local_threads(options, 4, given_option_names(remote))
    assert options.view_as(DirectOptions).direct_running_mode == "in_memory"


def test_a_batch_pickles_whole_and_comes_back_as_a_batch():
    from apache_beam.coders import registry
    from apache_beam.typehints import Any

    batch = Batch([{"doc_id": "a", "x": np.arange(3, dtype=np.float32)}, {"doc_id": "b"}])
    coder = registry.get_coder(Any)
    back = coder.decode(coder.encode(batch))
    assert type(back) is Batch and back[0]["doc_id"] == "a" and back[1] == {"doc_id": "b"}
    np.testing.assert_array_equal(back[0]["x"], batch[0]["x"])



class CountsPickles:
    """A record that counts how often it is pickled."""

    pickled = 0

    def __init__(self, payload: bytes):
        self.payload = payload

    def __reduce__(self):
        CountsPickles.pickled += 1
        return CountsPickles, (self.payload,)


def test_batch_coder_round_trips_and_estimates_a_batch_from_its_first_record():
    """Beam samples the size of most elements of a PCollection with few elements: BatchCoder's estimate
    pickles one record, not the list, and still comes close to the encoded size."""
    from pipeline.records import BatchCoder

    coder = BatchCoder()
    batch = Batch(CountsPickles(bytes(1000)) for _ in range(200))
    CountsPickles.pickled = 0
    estimate = coder.get_impl().estimate_size(batch)
    assert CountsPickles.pickled == 1
    encoded = coder.encode(batch)
    assert CountsPickles.pickled == 201
    assert 0.8 < estimate / len(encoded) < 1.25
    back = coder.decode(encoded)
    assert type(back) is Batch and len(back) == 200 and back[5].payload == bytes(1000)
    assert coder.get_impl().estimate_size(Batch()) > 0


def test_the_graph_moves_documents_tokens_and_rows_with_batch_coder(tmp_path):
    """The lists that carry every document (read, reshuffled, tokenised, scored rows) are declared Batch,
    so the job encodes them with BatchCoder; a list declared otherwise would fall back to pickling whole
    lists for every size sample."""
    import apache_beam as beam
    from apache_beam.coders import registry

    from pipeline.graph import build_pipeline
    from pipeline.io import sinks
    from pipeline.options import parse_options
    from pipeline.records import BatchCoder
    from pipeline.validate import validate

    shard = write_jsonl(tmp_path / "a.jsonl", [{"id": "d0", "text": SENTENCES[0]}])
    options, eo = parse_options(["--input", str(shard), *common_flags("coders", tmp_path / "out"), "--attention", "native",
                                 "--direct_num_workers", "2"])  # one shard, two bundles: its lists are spread
    p = beam.Pipeline(options=options)
    plan = validate(eo)
    plan = dataclasses.replace(plan, batch=dataclasses.replace(plan.batch, local_threads=2))  # as launch sets it
    build_pipeline(p, eo, plan, sinks.OutputSpec.for_run(eo.output, eo.run_id, eo.output_format))
    coders: dict[str, str] = {}

    class Outputs(beam.pipeline.PipelineVisitor):
        def visit_transform(self, applied):
            for tag, pcoll in applied.outputs.items():
                if tag is None:  # the main output
                    coders[applied.full_label.split("/")[0]] = type(registry.get_coder(pcoll.element_type)).__name__

    p.visit(Outputs())
    for step in ("ReadShards", "SpreadDocs", "Tokenize", "Score"):  # SpreadDocs: its last inner step's output
        assert coders[step] == BatchCoder.__name__, (step, coders.get(step))


def test_a_local_run_spreads_documents_only_where_its_bundles_would_idle():
    """Beam's local runners hold a Reshuffle's whole input in memory before the next step: the reshuffle of
    the documents read (the corpus's text, ~5x its bytes: 977 MB peak for a 96 MB corpus on one worker, 542 MB
    without it) is left out where it gains nothing, on one worker or with a shard for every bundle. A remote
    runner always has it."""
    from pipeline.graph import spreads_documents

    assert not spreads_documents(local=True, shards=1, local_bundles=1)
    assert not spreads_documents(local=True, shards=5, local_bundles=2)
    assert spreads_documents(local=True, shards=1, local_bundles=2)
    assert spreads_documents(local=False, shards=100, local_bundles=1)


def test_a_document_without_its_text_keeps_every_other_field():
    import dataclasses

    from pipeline.records import Document

    doc = Document(doc_id="d", text="some text", source="s.jsonl", record_index=7, fields={"label": "x"}, read_ms=1.5)
    assert doc.without_text() == dataclasses.replace(doc, text="")


@pytest.mark.integration
def test_parallel_bundles_and_small_beam_batches_give_the_outputs_of_one_thread(tmp_path, minilm):
    """The same corpus through one bundle with large Beam batches and through 3 parallel bundles (threads
    sharing the model) with one-call Beam batches: the same rows, the same embeddings."""
    texts = [f"{s} ({i})" for i, s in enumerate(SENTENCES * 40)]  # 480 documents: 2 read lists
    corpus = write_jsonl(tmp_path / "in" / "docs.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)])
    out = tmp_path / "out"
    assert run_docscore("--input", corpus, *common_flags("one", out), "--direct_num_workers", "1") == 0
    assert run_docscore("--input", corpus, *common_flags("par", out), "--direct_running_mode", "multi_threading",
                        "--direct_num_workers", "3", "--calls_per_beam_batch", "1") == 0
    one, _ = read_table(out, "scores", "one")
    par, _ = read_table(out, "scores", "par")
    one, par = one.sort_values("doc_id").reset_index(), par.sort_values("doc_id").reset_index()
    assert list(one.doc_id) == list(par.doc_id) and len(one) == len(texts)
    np.testing.assert_allclose(np.stack(par.embedding), np.stack(one.embedding), atol=1e-6)
    summary = read_summary(out, "par")
    assert summary["runner"]["direct_num_workers"] == 3 and summary["batching"]["calls_per_beam_batch"] == 1
    assert summary["batching"]["local_threads"] == 3 and read_summary(out, "one")["batching"]["local_threads"] == 1
    assert summary["batching"]["tail_call_fraction"] == 8  # the CPU's tail calls
    assert summary["batching"]["beam_batch_tokens"] == 8 * TEST_MAX_LEN
    assert summary["device"]["busy_s"] > 0 and 0 < summary["device"]["busy_fraction"] <= 1.0
    assert summary["command_wall_s"] > summary["wall_s"] > 0
    phases = summary["command_phases_s"]  # where the command's time went: they add up to it
    assert set(phases) == set(COMMAND_PHASES) and min(phases.values()) >= 0
    assert sum(phases.values()) == pytest.approx(summary["command_wall_s"], abs=0.01)
    assert phases["job"] > 0 and summary["wall_s"] <= phases["prepare"] + phases["job"] + 0.01  # the pipeline's part
    assert summary["compile"]["cold_count"] + summary["compile"]["cached_count"] == summary["compile"]["count"]


def test_progress_counts_documents_as_each_model_call_finishes(tmp_path, minilm):
    """One Beam batch of many calls: the handler counts a document done when the call holding its last
    window is read, so the progress file moves call by call, and ends at every document exactly once."""
    from pipeline.records import Document
    from pipeline.stages.inference import FlaxModelHandler, ModelSpec
    from pipeline.stages.preprocess import WindowSpec, tokenize_documents
    from pipeline.telemetry import progress

    docs = [Document(f"d{i}", f"{s} ({i})", "src", i) for i, s in enumerate(SENTENCES * 5)]
    tokenized = tokenize_documents(docs, minilm.tokenizer, WindowSpec(TEST_MAX_LEN, 8, 8), with_query=False)
    handler = FlaxModelHandler(ModelSpec("minilm-l6", attention="native"), task="embed", max_len=TEST_MAX_LEN,
                               batch_size=2, calls_per_beam_batch=32, kernel="xla", progress_dir=str(tmp_path))
    model = handler.load_model()
    seen = []
    real_add = progress.RecordCounter.add
    progress.RecordCounter.add = lambda self, n: (seen.append(n), real_add(self, n))[1]
    try:
        results = handler.run_inference([Batch(tokenized[:30]), Batch(tokenized[30:])], model)
    finally:
        progress.RecordCounter.add = real_add
    assert sum(len(r.inference) for r in results) == len(docs)
    assert len(seen) > 3 and sum(seen) == len(docs)  # call by call, each document once
    assert progress.read_counter_files(str(tmp_path)).done == len(docs)


def test_the_launcher_builds_its_job_without_importing_torch_which_stays_importable():
    """Beam's RunInference module would import torch (for a model manager docscore does not use): in a fresh
    process with torch installed, the launcher's imports and a graph build leave it out, and a later
    `import torch` still works (the test venv has torch; the runtime install does not)."""
    import subprocess
    import sys

    code = ("import sys; import pipeline.launch, pipeline.graph; "
            "from pipeline.stages.inference import RunInference, torch_hidden; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "import torch; print('torch', torch.__version__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("torch ")


def test_the_launcher_leaves_out_accelerator_kernel_libraries_and_scipy_until_used():
    """Every command starts by importing the launcher: on a CPU host it must not pay for the Triton and TPU
    lowerings of kernels it never traces, nor scipy (only a run's metrics need scipy.stats); tracing the
    Pallas GPU kernel (in its interpreter) then imports its module."""
    import subprocess
    import sys

    code = ("import sys; import pipeline.launch, pipeline.graph, pipeline.tasks, kernels; "
            "late = ('jax.experimental.pallas.ops.gpu.attention', 'jax.experimental.pallas.ops.tpu.flash_attention', "
            "'jax.experimental.pallas.ops.tpu.splash_attention', 'scipy'); "
            "loaded = [m for m in late if m in sys.modules]; assert not loaded, loaded; "
            "import jax.numpy as jnp; from kernels.pallas_gpu import pallas_gpu_attention; "
            "q = jnp.ones((1, 16, 2, 16), jnp.bfloat16); pallas_gpu_attention(q, q, q, interpret=True); "
            "print('traced', late[0] in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "traced True"


def test_the_command_clock_starts_when_its_process_starts():
    """summary.json's command_wall_s counts from the process's start, on the monotonic clock (a step of the system
    clock during a run is not the run's time): a process started after `before` says it started after it (to a
    10 ms clock tick), not up to a second earlier as boot time in whole seconds would."""
    import subprocess
    import sys
    import time

    before = time.monotonic()
    done = subprocess.run([sys.executable, "-c", "from pipeline.launch import process_start_time; print(process_start_time())"],
                          capture_output=True, text=True, timeout=120)
    after = time.monotonic()
    assert done.returncode == 0, done.stderr[-2000:]
    assert before - 0.02 <= float(done.stdout) <= after


@pytest.mark.parametrize("output_format,task", [("parquet", "embed"), ("jsonl", "classify"), ("parquet", "similarity")])
def test_the_graph_type_checks_with_its_annotations_read(tmp_path, monkeypatch, output_format, task):
    """Beam 2.78 reads string annotations (`from __future__ import annotations`) as type hints, where the pinned
    2.77 ignores them: each step's annotations must agree with the types the graph declares (a `list[Document]`
    parameter fed a Batch failed every run's pipeline construction on 2.78). Beam reads them here as 2.78 does."""
    import inspect

    import apache_beam as beam
    from apache_beam.typehints import decorators

    from pipeline.graph import build_pipeline
    from pipeline.io import sinks
    from pipeline.options import parse_options
    from pipeline.validate import validate

    plain = decorators.get_signature

    def resolved(fn):  # the annotations evaluated in the function's module, as Beam 2.78 resolves them
        try:
            return inspect.signature(fn, eval_str=True)
        except Exception:  # a builtin, or a name only a TYPE_CHECKING import holds: as Beam reads it today
            return plain(fn)

    monkeypatch.setattr(decorators, "get_signature", resolved)
    rows = [{"id": "d0", "text": SENTENCES[0], "query": SENTENCES[1], "label": "a"}]
    shard = write_jsonl(tmp_path / "a.jsonl", rows)
    task_flags = {"classify": ["--labels", "a=first letter;b=second letter"]}.get(task, [])
    options, eo = parse_options(["--input", str(shard), *common_flags("types", tmp_path / "out"), "--task", task,
                                 *task_flags, "--output_format", output_format, "--attention", "native"])
    p = beam.Pipeline(options=options)
    assert options.view_as(beam.options.pipeline_options.TypeOptions).pipeline_type_check
    outputs = build_pipeline(p, eo, validate(eo), sinks.OutputSpec.for_run(eo.output, eo.run_id, eo.output_format))
    assert set(outputs) == {"scores", "errors", "stats", "published"}


def test_each_document_gets_its_own_windows_queries_costs_labels_and_shadow_outputs():
    """document_outputs splits one batch's run_model outputs (every document's windows, then its query windows)
    back into documents: a slice off by one document gives a row another document's embedding, time or tokens."""
    import types

    from pipeline.records import Document
    from pipeline.stages.inference import ScoringModel, document_outputs
    from pipeline.stages.packing import WindowCost
    from pipeline.stages.preprocess import TokenizedDoc

    def doc(name, windows, queries):
        return TokenizedDoc(Document(name, "", "s", 0), [np.zeros(4, np.int32)] * windows, 4 * windows, False, 0.0,
                            query_windows=[np.zeros(3, np.int32)] * queries)

    docs = [doc("a", 2, 1), doc("b", 1, 0), doc("c", 3, 2)]
    rows = 2 + 1 + 1 + 3 + 2
    outputs = [np.full(2, i, np.float32) for i in range(rows)]
    shadow_outputs = [np.full(2, 100 + i, np.float32) for i in range(rows)]
    timings = [WindowCost(ms_per_row=2.0**i, computed_tokens_per_row=10.0 * i) for i in range(rows)]
    labels = np.eye(2, dtype=np.float32)
    model = ScoringModel(loaded=types.SimpleNamespace(model_id="m", attention="xla", fingerprint="f"), backend="cpu",
                         label_names=("x", "y"), label_embeddings=labels,
                         shadow_loaded=types.SimpleNamespace(attention="blockwise"), shadow_label_embeddings=-labels)
    per_doc = document_outputs(docs, outputs, timings, model, shadow_outputs)

    def firsts(arrays):
        return [int(a[0]) for a in arrays]

    assert [(firsts(o.window_outputs), firsts(o.query_outputs)) for o in per_doc] == [
        ([0, 1], [2]), ([3], []), ([4, 5, 6], [7, 8])]
    assert [o.infer_ms for o in per_doc] == [1 + 2 + 4, 8, 16 + 32 + 64 + 128 + 256]
    assert [o.computed_tokens for o in per_doc] == [0 + 10 + 20, 30, 40 + 50 + 60 + 70 + 80]
    assert {(o.model_id, o.attention_impl, o.fingerprint, o.backend, o.label_names) for o in per_doc} == {
        ("m", "xla", "f", "cpu", ("x", "y"))}
    assert all(o.label_embeddings is labels and o.shadow.label_embeddings is not labels for o in per_doc)
    assert [(firsts(o.shadow.window_outputs), firsts(o.shadow.query_outputs), o.shadow.attention_impl)
            for o in per_doc] == [([100, 101], [102], "blockwise"), ([103], [], "blockwise"),
                                  ([104, 105, 106], [107, 108], "blockwise")]
    np.testing.assert_array_equal(per_doc[0].shadow.label_embeddings, -labels)
    assert all(o.shadow is None for o in document_outputs(docs, outputs, timings, model))


def test_every_accelerator_runs_one_row_length_in_full_calls_and_the_calls_get_the_runs_settings():
    """A TPU, like a GPU, compiles for tens of seconds per program: rows of max_len only, full-size calls only, and
    two parallel bundles (one tokenizes while the other's calls run). call_shapes is what every model call of the
    run (documents, labels, shadow) is given, so it carries the backend's settings; the flags are checked."""
    for backend in ("gpu", "tpu"):
        accelerator = batching.settings_for(backend)
        assert (accelerator.shortest_row(512), accelerator.tail_call_fraction, accelerator.local_threads) == (512, 1, 2)
        assert accelerator.call_shapes(512) == {"max_len": 512, "batch_size": accelerator.batch_size,
                                                "min_row_len": 512, "tail_fraction": 1}
    assert batching.settings_for("cpu", batch_size=4).call_shapes(256) == {"max_len": 256, "batch_size": 4,
                                                                           "min_row_len": 64, "tail_fraction": 8}
    assert batching.settings_for("cpu", local_threads=3).local_threads == 3
    for flag, value in (("batch_size", 0), ("direct_num_workers", 0)):
        with pytest.raises(ValueError, match=f"--{flag}=0 must be >= 1"):
            batching.settings_for("cpu", **{"local_threads" if flag == "direct_num_workers" else flag: value})
    assert [batching.rows_for_devices(rows, 4) for rows in (1, 4, 5, 8)] == [4, 4, 8, 8]  # up, never down


def test_run_inference_answers_each_list_of_documents_with_its_own_outputs(tmp_path, minilm):
    """A Beam batch of several lists: each PredictionResult holds the outputs of its own list's documents, in order,
    their windows' embeddings and then their queries' (similarity), as the model gives each window alone; the
    progress counter counts each document once, however many windows it has."""
    from pipeline.records import Document
    from pipeline.stages.inference import FlaxModelHandler, ModelSpec
    from pipeline.stages.preprocess import WindowSpec, tokenize_documents
    from pipeline.telemetry import progress

    texts = [(SENTENCES[0], SENTENCES[1]), (" ".join(SENTENCES[2:6]), SENTENCES[6]), (SENTENCES[7], " ".join(SENTENCES[8:]))]
    docs = [Document(f"d{i}", text, "src", i, fields={"query": query}) for i, (text, query) in enumerate(texts)]
    tokenized = tokenize_documents(docs, minilm.tokenizer, WindowSpec(TEST_MAX_LEN, 8, 8), with_query=True)
    assert [(len(t.windows), len(t.query_windows)) for t in tokenized] == [(1, 1), (3, 1), (1, 3)]
    handler = FlaxModelHandler(ModelSpec("minilm-l6", attention="native"), task="similarity", max_len=TEST_MAX_LEN,
                               batch_size=8, calls_per_beam_batch=32, kernel="xla", progress_dir=str(tmp_path))
    results = handler.run_inference([Batch(tokenized[:1]), Batch(tokenized[1:])], handler.load_model())
    assert progress.read_counter_files(str(tmp_path)).done == len(tokenized)
    assert [r.example for r in results] == [tokenized[:1], tokenized[1:]]
    outputs = [o for r in results for o in r.inference]
    assert len(outputs) == len(tokenized)
    windows = [w for doc in tokenized for w in doc.windows + doc.query_windows]
    got = [e for output in outputs for e in output.window_outputs + output.query_outputs]
    ids, segments = np.zeros((16, TEST_MAX_LEN), np.int32), np.zeros((16, TEST_MAX_LEN), np.int32)  # a window a row
    for row, window in enumerate(windows):
        ids[row, :len(window)], segments[row, :len(window)] = window, 1
    alone = np.concatenate([minilm.embed_packed(ids[r:r + 8], segments[r:r + 8], 1)[:, 0] for r in (0, 8)])[:len(windows)]
    assert len(got) == len(windows) == 10
    np.testing.assert_allclose(np.stack(got), alone, atol=2e-5)


def test_a_tasks_texts_are_embedded_window_by_window_with_the_windows_it_is_given(minilm):
    """texts_embedder (classify's label descriptions): each text the normalised mean of its windows, split with the
    (stride, max windows) it is given, as a document's text is (conftest.direct_embeddings calls the model itself)."""
    from pipeline.stages.inference import texts_embedder
    from tests.conftest import LONG_TEXT, direct_embeddings

    texts = [SENTENCES[0], LONG_TEXT, SENTENCES[3]]  # LONG_TEXT: three windows of 32 tokens with stride 8
    shapes = batching.settings_for("cpu", batch_size=8).call_shapes(TEST_MAX_LEN)
    for stride, max_windows in ((8, 8), (0, 2)):
        embed = texts_embedder(minilm, shapes, (stride, max_windows))
        np.testing.assert_allclose(embed(texts), direct_embeddings(minilm, texts, stride=stride, max_windows=max_windows),
                                   atol=2e-5)
