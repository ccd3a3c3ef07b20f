"""Token-budget batching by packing: variable-length windows -> rows of a few fixed lengths holding several
windows each (segment ids 1, 2, ...), run in calls of a fixed token budget, outputs mapped back.

Holds the row lengths (max_len and its halves: a window goes to the shortest row that holds it, so short
documents do not pay for attention over long rows; on CPU also twice max_len), the packing plan (best-fit
decreasing, or filling longer rows first where that costs less), the call
sizes (a full call of batch_size * max_len tokens, then small calls for the tail, so each model method
compiles at most two shapes per row length) and the runner. Must not call Beam, load models or know which
task is scored (the callers pass the model function).
"""
from __future__ import annotations

import dataclasses
import time
from bisect import bisect_left, insort
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pipeline.stages import batching

MIN_SEGMENT_TOKENS = 8  # sets the segment slots per row: row_len // 8 (a window has >= 2 special tokens)
# Where a caller passes no batch settings (benchmarks, tests): a CPU's, read from batching.py's tables. The
# pipeline and FlaxModelHandler pass their run's BatchSettings values instead.
MIN_ROW_LEN = batching.MIN_ROW_LEN["cpu"]
TAIL_CALL_FRACTION = batching.TAIL_CALL_FRACTION["cpu"]


@dataclasses.dataclass
class WindowCost:
    """One window's share of the calls that computed it, in proportion to its tokens."""

    ms_per_row: float = 0.0
    computed_tokens_per_row: float = 0.0


@dataclasses.dataclass(frozen=True)
class PackedRow:
    """Window indices in one row of row_len tokens, in order: window k of the row has segment id k + 1."""

    windows: tuple[int, ...]
    row_len: int


def max_segments_for(row_len: int) -> int:
    """Segment slots per row of row_len tokens (a row never holds more windows)."""
    return max(1, row_len // MIN_SEGMENT_TOKENS)


def pack_windows(lengths: Sequence[int], row_lens: Sequence[int]) -> list[PackedRow]:
    """Best-fit decreasing: longest windows first (ties in index order), each into the open row with the
    least free room that still holds it (tokens and a segment slot; ties to the row that got that room
    last); a window that fits no open row opens one of the shortest of row_lens that holds it. So short
    windows fill the gaps of long rows before they open short rows of their own. Deterministic,
    O(n log n). Raises ValueError for a window longer than every row length."""
    sizes = _sizes(lengths)
    rows, row_lens_used, _ = _best_fit(sizes, _longest_first(sizes), sorted(row_lens))
    return [PackedRow(tuple(r), size) for r, size in zip(rows, row_lens_used)]


# A row of R tokens costs about R * (1 + R / ATTENTION_COST_TOKENS): the dense layers per token, attention per token
# growing with the row. Fitted to MiniLM float32 on CPU at rows of 64, 128 and 256 tokens (benchmarks/README.md,
# "Row lengths and CPU tuning in the model loop").
ATTENTION_COST_TOKENS = 768


def row_cost(row_len: int) -> float:
    return row_len * (1 + row_len / ATTENTION_COST_TOKENS)


def plan_rows(lengths: Sequence[int], row_lens: Sequence[int]) -> list[PackedRow]:
    """The cheapest (row_cost) of these plans of the same windows: pack_windows over every row length (a window
    opens the shortest row that holds it, so short windows pay little attention), and for each longer row
    length, pack_windows into rows of that length, each row then cut to the shortest length that holds what
    it got. Filling longer rows wins where windows sit just above a row length's half (66-token windows: one
    per 128-token row, three per 256-token row; 130-token windows: one per 256-token row, three per 512-token
    row). All use the same row lengths: the same compiled shapes."""
    row_lens = sorted(row_lens)
    sizes = _sizes(lengths)
    order = _longest_first(sizes)
    rows, used_lens, _ = _best_fit(sizes, order, row_lens)
    cost = sum(map(row_cost, used_lens))
    for fill in row_lens:
        if fill < max(sizes, default=0) or fill <= min(used_lens, default=fill):
            continue  # a window would not fit, or the plan would be pack_windows' own
        filled, _, tokens = _best_fit(sizes, order, [fill])
        cut = [_shortest_row_with_slots(t, len(r), row_lens) for r, t in zip(filled, tokens)]
        cut_cost = sum(map(row_cost, cut))
        if cut_cost < cost:
            rows, used_lens, cost = filled, cut, cut_cost
    return [PackedRow(tuple(r), size) for r, size in zip(rows, used_lens)]


def _sizes(lengths: Sequence[int]) -> list[int]:
    return np.asarray(lengths, dtype=np.int64).tolist()


def _longest_first(sizes: list[int]) -> list[int]:
    return sorted(range(len(sizes)), key=sizes.__getitem__, reverse=True)  # stable: equal lengths by index


def _best_fit(sizes: list[int], order: list[int], row_lens: list[int]) -> tuple[list[list[int]], list[int], list[int]]:
    """pack_windows' plan as (each row's window indices, its length, its tokens)."""
    rows: list[list[int]] = []
    lens: list[int] = []
    tokens: list[int] = []
    slots_left: list[int] = []
    opens = {n: _shortest_row(n, row_lens) for n in set(sizes)}  # the row length a window of n tokens opens
    slots = {m: max_segments_for(m) for m in row_lens}
    # Open rows with a free slot, by free tokens: free room is at most the longest row length, so the best
    # fit is one bisect over the distinct free values instead of a scan over every open row.
    by_free: dict[int, list[int]] = {}
    free_values: list[int] = []  # the keys of by_free, ascending
    for i in order:
        n = sizes[i]
        k = bisect_left(free_values, n)
        if k < len(free_values):
            room = free_values[k]
            bucket = by_free[room]
            r = bucket.pop()
            if not bucket:
                del by_free[room]
                del free_values[k]
            rows[r].append(i)
            tokens[r] += n
        else:
            row_len = opens[n]
            r = len(rows)
            rows.append([i])
            lens.append(row_len)
            tokens.append(n)
            slots_left.append(slots[row_len])
            room = row_len
        slots_left[r] -= 1
        _bucket_row(by_free, free_values, r, room - n, slots_left[r])
    return rows, lens, tokens


def _shortest_row_with_slots(tokens: int, windows: int, row_lens: Sequence[int]) -> int:
    """The shortest of row_lens (ascending) with room for `tokens` tokens in `windows` segment slots."""
    return next(m for m in row_lens if m >= tokens and max_segments_for(m) >= windows)


def _shortest_row(n: int, row_lens: Sequence[int]) -> int:
    """The shortest of row_lens (ascending) that holds a window of n tokens."""
    row_len = next((m for m in row_lens if m >= n), None)
    if row_len is None:
        raise ValueError(f"a window of {n} tokens does not fit rows of {row_lens[-1]}; window documents "
                         f"to <= {row_lens[-1]} tokens (--max_seq_len)")
    return row_len


def _bucket_row(by_free: dict[int, list[int]], free_values: list[int], r: int, room: int, slots: int) -> None:
    """Put row r back among the open rows under its free room, unless it has no room or no slot left."""
    if room <= 0 or slots <= 0:
        return
    bucket = by_free.get(room)
    if bucket is None:
        by_free[room] = bucket = []
        insort(free_values, room)
    bucket.append(r)


# Rows of twice --max_seq_len join the row lengths on CPU (several lengths) while they stay this short: two or
# three windows just over half of max_seq_len (text chunked to 128 tokens for a 256-token model) then share one
# (positions restart per segment, so no window is longer than max_seq_len; benchmarks/README.md, "Packing plans"). Longer rows would make dense attention's [L, L] scores large.
LONG_ROWS_UP_TO = 512


def row_lengths(max_len: int, min_row_len: int = MIN_ROW_LEN, batch_size: int | None = None,
                min_rows: int = 1) -> tuple[int, ...]:
    """The row lengths windows of <= max_len tokens are packed into, ascending: max_len and its halves down to
    min_row_len (max_len alone when it is odd or below 2 * min_row_len), and where there are several of them
    and max_len <= LONG_ROWS_UP_TO, 2 * max_len - given a batch_size, only when a call of min_rows such rows
    holds no more [L, L] attention scores than batch_size rows of max_len (batch_size >= 4 * min_rows). Each
    length costs its own compiled programs: an accelerator, where compiles are slow and short rows save
    little, uses one."""
    lengths = [max_len]
    while lengths[-1] % 2 == 0 and lengths[-1] // 2 >= min_row_len:
        lengths.append(lengths[-1] // 2)
    fits = batch_size is None or batch_size // 4 >= min_rows
    longer = (2 * max_len,) if len(lengths) > 1 and max_len <= LONG_ROWS_UP_TO and fits else ()
    return tuple(reversed(lengths)) + longer


def rows_per_call(row_len: int, max_len: int, batch_size: int, min_rows: int = 1,
                  tail_fraction: int = TAIL_CALL_FRACTION) -> tuple[int, int]:
    """(full, tail) rows per call for rows of row_len: a full call computes batch_size rows of max_len
    tokens whatever the row length (the token budget), and a call of rows longer than max_len holds no more
    attention scores ([L, L] per row) than that, so the memory check of --batch_size covers it; a tail call
    1/tail_fraction of a full one (1: the same). Both are multiples of min_rows (one row per device)."""
    if batch_size < 1 or min_rows < 1 or batch_size % min_rows:
        raise ValueError(f"batch_size ({batch_size}) must be a positive multiple of min_rows ({min_rows}, "
                         "the local device count); set --batch_size to a multiple of it")
    if row_len > max_len:
        full = max(min_rows, batch_size * max_len * max_len // (row_len * row_len) // min_rows * min_rows)
    else:
        full = batch_size * max(1, max_len // row_len)
    if tail_fraction < 1:
        raise ValueError(f"tail_fraction ({tail_fraction}) must be >= 1")
    tail = max(min_rows, full // tail_fraction // min_rows * min_rows)
    return full, tail


def call_sizes(n_rows: int, full: int, tail: int = 1) -> list[int]:
    """Rows per call: calls of `full` rows, then calls of `tail` rows for the rest, the last one padded
    with empty rows up to `tail`. At most two distinct sizes; `tail` need not divide `full`."""
    if not 1 <= tail <= full:
        raise ValueError(f"tail call rows ({tail}) must be between 1 and the full call's rows ({full})")
    whole, rest = divmod(n_rows, full)
    return [full] * whole + [tail] * -(-rest // tail)


def shapes_for(max_len: int, batch_size: int, min_rows: int = 1, min_row_len: int = MIN_ROW_LEN,
               tail_fraction: int = TAIL_CALL_FRACTION) -> set[tuple[int, int]]:
    """Every [rows, row_len] input shape the runner can call with: the compile bound per method."""
    shapes = set()
    for row_len in row_lengths(max_len, min_row_len, batch_size, min_rows):
        shapes |= {(rows, row_len) for rows in rows_per_call(row_len, max_len, batch_size, min_rows, tail_fraction)}
    return shapes


def plan_calls(
    rows: Sequence[PackedRow], max_len: int, batch_size: int, min_rows: int = 1, min_row_len: int = MIN_ROW_LEN,
    tail_fraction: int = TAIL_CALL_FRACTION,
) -> list[tuple[int, Sequence[PackedRow], int]]:
    """The model calls that run packed rows, as (row_len, the call's rows, rows in the call): rows of one
    length per call, call_sizes of rows_per_call for each length (the last call of a length may hold
    fewer rows than its size: the rest is padding)."""
    calls = []
    for row_len in row_lengths(max_len, min_row_len, batch_size, min_rows):
        same_len = [row for row in rows if row.row_len == row_len]
        start = 0
        for size in call_sizes(len(same_len), *rows_per_call(row_len, max_len, batch_size, min_rows, tail_fraction)):
            calls.append((row_len, same_len[start : start + size], size))
            start += size
    return calls


def fill_rows(
    windows: Sequence[np.ndarray], rows: Sequence[PackedRow], row_len: int, n_rows: int | None = None
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, int, int]]]:
    """The model inputs of packed rows: input_ids and segment_ids [n_rows, row_len] (segment s + 1 in
    slot s, 0 = padding; rows past len(rows) are all padding) and where each window went, as
    (window index, row, segment slot, start)."""
    n_rows = len(rows) if n_rows is None else n_rows
    input_ids = np.zeros((n_rows, row_len), np.int32)
    segment_ids = np.zeros((n_rows, row_len), np.int32)
    placed = []
    for r, row in enumerate(rows):
        at = 0
        for slot, i in enumerate(row.windows):
            n = len(windows[i])
            input_ids[r, at : at + n] = windows[i]
            segment_ids[r, at : at + n] = slot + 1
            placed.append((i, r, slot, at))
            at += n
    return input_ids, segment_ids, placed


def run_packed(
    windows: Sequence[np.ndarray],
    call: Callable[[np.ndarray, np.ndarray], Any],
    *,
    max_len: int,
    batch_size: int,
    per_token: bool = False,
    min_rows: int = 1,
    min_row_len: int = MIN_ROW_LEN,
    tail_fraction: int = TAIL_CALL_FRACTION,
    on_call_read: Callable[[list[int]], None] | None = None,
    compiling_s: Callable[[], float] | None = None,
) -> tuple[list[np.ndarray], list[WindowCost], dict[str, float]]:
    """Run windows of <= max_len tokens through `call(input_ids, segment_ids)` in packed rows of
    row_lengths(max_len, min_row_len, batch_size, min_rows), as plan_rows chooses, in the calls plan_calls
    makes of them (tail_fraction: its tail calls' size).

    call returns [B, max_segments_for(row_len), D] (slot s = segment s + 1; embeddings) or, with
    per_token, [B, row_len] (one value per position), as a numpy array or an array that np.asarray waits
    for (a JAX array still being computed): every call is dispatched before the first result is read,
    so the host fills the next call's rows while the device computes. Returns each window's output
    (per_token outputs cut to the window), its share of the batch's time and of the computed tokens in
    proportion to its tokens, and totals (calls, computed and real tokens, milliseconds). A NaN in one window's
    values reaches every window of its row (attention weighs a row-mate's values by 0, and 0 x NaN is NaN): the
    windows of a row that came back NaN run again in two halves, each in rows of its own, and a half that is still
    NaN is halved again, down to the window that overflowed (about 2 log2(n) rows for a row of n windows with one
    such window, log2(n) reruns of everything when the model itself gives NaN); costs count every run. on_call_read gets
    the indices of each call's windows as soon as its result is read (progress per model call). compiling_s: the
    seconds this thread has spent compiling so far; compiling is left out of the batch's time (totals' ms, the
    windows' shares; totals' compile_ms has it), so a run's infer timings do not depend on its compilation cache."""
    lengths = row_lengths(max_len, min_row_len, batch_size, min_rows)
    rows = plan_rows([len(w) for w in windows], lengths)
    outputs: list[np.ndarray | None] = [None] * len(windows)
    costs = [WindowCost() for _ in windows]
    totals = {"calls": 0, "computed_tokens": 0, "real_tokens": 0, "ms": 0.0, "compile_ms": 0.0}
    compiled_before = compiling_s() if compiling_s is not None else 0.0
    t0 = time.perf_counter()
    plan = plan_calls(rows, max_len, batch_size, min_rows, min_row_len, tail_fraction)
    saw_nan = _run_calls(windows, plan, call, per_token, outputs, costs, totals, on_call_read)
    runs = [1] * len(windows)  # how many times each window ran
    if saw_nan:
        groups = [list(row.windows) for row in rows if len(row.windows) > 1 and _any_nan(outputs, row.windows)]
        while groups:  # halves of the rows that came back NaN, each in rows of its own, until the NaN is cornered
            halves = [half for group in groups for half in (group[: len(group) // 2], group[len(group) // 2 :])]
            again = [PackedRow(tuple(half[k] for k in row.windows), row.row_len) for half in halves
                     for row in plan_rows([len(windows[i]) for i in half], lengths)]
            counted = {i: costs[i].computed_tokens_per_row for half in halves for i in half}
            _run_calls(windows, plan_calls(again, max_len, batch_size, min_rows, min_row_len, tail_fraction), call,
                       per_token, outputs, costs, totals, None)
            for i, tokens in counted.items():
                costs[i].computed_tokens_per_row += tokens
                runs[i] += 1
            groups = [half for half in halves if len(half) > 1 and _any_nan(outputs, half)]
    if compiling_s is not None:
        totals["compile_ms"] = (compiling_s() - compiled_before) * 1000.0
    totals["ms"] = max(0.0, (time.perf_counter() - t0) * 1000.0 - totals["compile_ms"])
    ran_tokens = max(1, sum(len(w) * n for w, n in zip(windows, runs)))
    for i, window in enumerate(windows):
        costs[i].ms_per_row = totals["ms"] * len(window) * runs[i] / ran_tokens
    return outputs, costs, totals  # type: ignore[return-value]


def _any_nan(outputs: list, indices: Sequence[int]) -> bool:
    return any(np.isnan(outputs[i]).any() for i in indices)


def _run_calls(windows: Sequence[np.ndarray], plan: list[tuple[int, Sequence[PackedRow], int]],
               call: Callable[[np.ndarray, np.ndarray], Any], per_token: bool, outputs: list, costs: list[WindowCost],
               totals: dict[str, float], on_call_read: Callable[[list[int]], None] | None) -> bool:
    """run_packed's calls of `plan`: every call dispatched, then each result read into outputs and costs (the
    windows it computed), totals counted. Whether a result held a NaN."""
    saw_nan = False
    pending = []
    for row_len, call_rows, size in plan:
        input_ids, segment_ids, placed = fill_rows(windows, call_rows, row_len, size)
        real = max(1, int(np.count_nonzero(segment_ids)))
        pending.append((call(input_ids, segment_ids), placed, size * row_len, real))
        totals["calls"] += 1
        totals["computed_tokens"] += size * row_len
        totals["real_tokens"] += real
    for result, placed, computed, real in pending:
        result = np.asarray(result, dtype=np.float32)  # waits for this call's device work
        saw_nan = saw_nan or bool(np.isnan(result).any())
        for i, r, slot, at in placed:
            n = len(windows[i])
            outputs[i] = result[r, at : at + n] if per_token else result[r, slot]
            costs[i].computed_tokens_per_row = computed * n / real
        if on_call_read is not None:
            on_call_read([i for i, *_ in placed])
    return saw_nan


def run_model(
    loaded, windows: Sequence[np.ndarray], *, max_len: int, batch_size: int, per_token: bool = False,
    min_row_len: int = MIN_ROW_LEN, tail_fraction: int = TAIL_CALL_FRACTION,
    on_call_read: Callable[[list[int]], None] | None = None,
) -> tuple[list[np.ndarray], list[WindowCost], dict[str, float]]:
    """run_packed with a models.LoadedModel: embed_packed (one embedding per window) or, per_token,
    token_logprobs (a decoder's next-token log-probs per window), each call dispatched without waiting
    (LoadedModel.start). Rows per call are rounded up to a multiple of the local device count (the model
    splits each call's rows over the devices). min_row_len and tail_fraction: the run's BatchSettings
    (shortest_row(max_len), tail_call_fraction), so an accelerator runs rows of max_len only, the length its
    kernel was chosen for at load, in full-size calls only."""
    import jax

    devices = jax.local_device_count()
    batch_size = batching.rows_for_devices(batch_size, devices)
    if per_token:

        def call(input_ids, segment_ids):
            return loaded.start("token_logprobs", input_ids, segment_ids)
    else:

        def call(input_ids, segment_ids):
            return loaded.start("embed_packed", input_ids, segment_ids, max_segments_for(input_ids.shape[1]))

    return run_packed(windows, call, max_len=max_len, batch_size=batch_size, per_token=per_token, min_rows=devices,
                      min_row_len=min_row_len, tail_fraction=tail_fraction, on_call_read=on_call_read,
                      compiling_s=lambda: float(loaded.compiles_by_this_thread()[1]))
