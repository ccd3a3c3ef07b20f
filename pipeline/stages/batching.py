"""How much work each model call and each Beam batch holds, per backend: the defaults that keep each kind
of device busy, and the settings a run uses (recorded in its summary).

Holds the per-backend defaults and their resolution against the flags. Must not pack rows or call models
(pipeline/stages/packing.py and pipeline/stages/inference.py use these settings).
"""
from __future__ import annotations

import dataclasses

# Rows of --max_seq_len tokens per model call, and model calls' worth of tokens per Beam batch. An accelerator
# wants large calls; a Beam batch of a few calls lets the next batch's host work (read, tokenize, score) overlap
# the device in parallel bundles. The CPU values are measured (benchmarks/PERF_NOTES.md, benchmarks/README.md);
# the GPU and TPU ones are not swept yet (the GPU ones ran in benchmarks/RESULTS.md, "GPU end to end").
BATCH_SIZE = {"cpu": 16, "gpu": 256, "tpu": 128}
CALLS_PER_BEAM_BATCH = {"cpu": 32, "gpu": 4, "tpu": 4}
# Parallel bundles (threads sharing one model) of a local DirectRunner run when no --direct_* flag is given:
# on an accelerator, a thread tokenizes and scores while the other's calls run on the device; more threads
# only queue for the GIL (benchmarks/PERF_NOTES.md, "A simulated device"; benchmarks/gpu_peers.py measures it
# on a GPU); on a CPU the model's own threads already use every core.
LOCAL_THREADS = {"cpu": 1, "gpu": 2, "tpu": 2}
# Shortest packed row (None: rows of max_len only). Attention costs each token O(row length) and the dense layers
# do not, so short rows save work, and each row length costs its own compiled programs: worth it on a CPU
# (compiles ~1 s) down to 64 tokens, where 32 gains nothing (benchmarks/README.md, "Row lengths"); not on an
# accelerator (tens of seconds each).
MIN_ROW_LEN = {"cpu": 64, "gpu": None, "tpu": None}
# A full call's rows over a tail call's (the calls that run what is left of a batch after its full calls): on a CPU
# tail calls of 1/8 pad the end of a batch little, and their programs compile in ~1 s; an accelerator pads that end
# to one full call instead, as the padding's compute costs it far less than compiling a second program
# (benchmarks/RESULTS.md, "GPU end to end").
TAIL_CALL_FRACTION = {"cpu": 8, "gpu": 1, "tpu": 1}


@dataclasses.dataclass(frozen=True)
class BatchSettings:
    """A run's batch settings."""

    backend: str
    batch_size: int  # rows of max_seq_len tokens per model call (shorter packed rows: proportionally more)
    calls_per_beam_batch: int  # a Beam batch holds this many full calls' worth of tokens
    local_threads: int  # parallel bundles of a local DirectRunner run (1: Beam's default in-memory runner)
    min_row_len: int | None  # shortest packed row length (None: max_len only)
    tail_call_fraction: int  # a full call's rows over a tail call's (1: every call full-size, one program per row length)

    def shortest_row(self, max_len: int) -> int:
        return self.min_row_len or max_len

    def call_shapes(self, max_len: int) -> dict[str, int]:
        """The shapes of a run's model calls for windows of max_len tokens, as run_model and FlaxModelHandler take
        them: every call of the run (documents, labels, shadow) gets the same ones, so they compile once."""
        return {"max_len": max_len, "batch_size": self.batch_size, "min_row_len": self.shortest_row(max_len),
                "tail_fraction": self.tail_call_fraction}

    def beam_batch_tokens(self, max_len: int) -> int:
        return beam_batch_tokens(self.batch_size, max_len, self.calls_per_beam_batch)

    def summary(self, max_len: int) -> dict[str, int | str]:
        return {**dataclasses.asdict(self), "beam_batch_tokens": self.beam_batch_tokens(max_len)}


def beam_batch_tokens(batch_size: int, max_len: int, calls_per_beam_batch: int) -> int:
    """Tokens in one Beam batch: calls_per_beam_batch full calls of batch_size rows of max_len tokens."""
    return batch_size * max_len * calls_per_beam_batch


def rows_for_devices(batch_size: int, devices: int) -> int:
    """--batch_size rounded up to a multiple of the devices each model call's rows are split over."""
    return -(-batch_size // devices) * devices


def settings_for(backend: str, *, batch_size: int | None = None, calls_per_beam_batch: int | None = None,
                 local_threads: int | None = None) -> BatchSettings:
    """The flags' values where given, else the backend's defaults. Raises ValueError naming the flag."""
    settings = BatchSettings(
        backend=backend,
        batch_size=BATCH_SIZE[backend] if batch_size is None else batch_size,
        calls_per_beam_batch=CALLS_PER_BEAM_BATCH[backend] if calls_per_beam_batch is None else calls_per_beam_batch,
        local_threads=LOCAL_THREADS[backend] if local_threads is None else local_threads,
        min_row_len=MIN_ROW_LEN[backend],
        tail_call_fraction=TAIL_CALL_FRACTION[backend],
    )
    for flag, value in (("batch_size", settings.batch_size), ("calls_per_beam_batch", settings.calls_per_beam_batch),
                        ("direct_num_workers", settings.local_threads)):
        if value < 1:
            raise ValueError(f"--{flag}={value} must be >= 1")
    return settings
