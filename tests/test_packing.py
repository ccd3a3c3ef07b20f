"""Token-budget batching by packing: the plan (every window once, rows within budget, short windows filling
long rows' gaps before opening short rows, at least as tight as first-fit decreasing on random windows,
two call shapes per row length), outputs mapped back to their
windows, packed MiniLM embeddings equal to one-window-per-row ones, and >= 90% padding efficiency on the
sample corpus with the real tokenizer."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.stages import batching
from pipeline.stages.packing import (PackedRow, call_sizes, max_segments_for, pack_windows, plan_calls, plan_rows, row_cost, row_lengths,
                              rows_per_call, run_model, run_packed, shapes_for)
from pipeline.stages.scoring import pool_windows
from tests.conftest import LONG_TEXT, SENTENCES, TEST_BATCH, TEST_MAX_LEN, TEST_STRIDE, direct_embeddings


def test_pack_windows_places_every_window_once_within_the_row_budget():
    rng = np.random.default_rng(0)
    lengths = [int(n) for n in rng.integers(2, 65, size=200)] + [64, 64, 1, 1, 1]
    rows = pack_windows(lengths, (64,))
    placed = [i for row in rows for i in row.windows]
    assert sorted(placed) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row.windows) <= 64 for row in rows)
    assert all(1 <= len(row.windows) <= max_segments_for(64) for row in rows)
    assert sum(lengths) / (64 * len(rows)) > 0.9  # about half are > 32 tokens and need a row each
    assert pack_windows(lengths, (64,)) == rows  # deterministic
    with pytest.raises(ValueError, match="max_seq_len"):
        pack_windows([65], (32, 64))


def test_short_windows_fill_long_rows_before_opening_short_rows():
    rows = pack_windows([200, 100, 60, 50, 30, 20, 20], (64, 128, 256))
    assert [(row.row_len, row.windows) for row in rows] == [
        (256, (0, 3)),  # 200 + 50: the 60 did not fit, the 50 does
        (128, (1, 5)),  # 100 + 20
        (64, (2,)),  # 60 fits no open row, so it opens the shortest row that holds it
        (64, (4, 6)),  # 30 opens a row, and the last 20 joins it
    ]


def first_fit_decreasing(lengths, row_lens):
    """The packer pack_windows replaced (each window into the first open row with room), the reference its
    plans must match or beat."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows, sizes, free = [], [], []
    for i in order:
        n = lengths[i]
        for r, room in enumerate(free):
            if room >= n and len(rows[r]) < max_segments_for(sizes[r]):
                rows[r].append(i)
                free[r] -= n
                break
        else:
            size = min(m for m in row_lens if m >= n)
            rows.append([i])
            sizes.append(size)
            free.append(size - n)
    return [PackedRow(tuple(r), size) for r, size in zip(rows, sizes)]


def random_lengths(rng, mix: str, n: int) -> list[int]:
    if mix == "tiny":  # 2-7 tokens: every row runs out of segment slots long before tokens
        return [int(x) for x in rng.integers(2, 8, size=n)]
    if mix == "short":  # 3-20 tokens: segment slots, not tokens, bound most rows
        return [int(x) for x in rng.integers(3, 21, size=n)]
    if mix == "long":
        return [int(x) for x in rng.integers(3, 257, size=n)]
    return paragraph_lengths(rng, n)


def paragraph_lengths(rng, n: int) -> list[int]:
    """Short paragraphs of 20-150 tokens and one window in ten a full 256 (a long document's windows)."""
    return [256 if rng.random() < 0.1 else int(rng.integers(20, 151)) for _ in range(n)]


def padding_efficiency(lengths, rows) -> float:
    return sum(lengths) / sum(row.row_len for row in rows)


def assert_valid_plan(lengths, rows, row_lens):
    assert sorted(i for row in rows for i in row.windows) == list(range(len(lengths)))
    for row in rows:
        assert sum(lengths[i] for i in row.windows) <= row.row_len
        assert 1 <= len(row.windows) <= max_segments_for(row.row_len)
        longest = max(lengths[i] for i in row.windows)
        assert lengths[row.windows[0]] == longest  # a row is opened by its longest window
        assert row.row_len == min(m for m in row_lens if m >= longest)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("mix", ["tiny", "short", "long", "paragraphs"])
@pytest.mark.parametrize("row_lens", [row_lengths(256), (256,)])
def test_pack_windows_is_valid_and_at_least_as_tight_as_first_fit(seed, mix, row_lens):
    lengths = random_lengths(np.random.default_rng(seed), mix, 600)
    rows = pack_windows(lengths, row_lens)
    assert_valid_plan(lengths, rows, row_lens)
    assert pack_windows(np.array(lengths), row_lens) == rows  # deterministic, numpy lengths too
    reference = first_fit_decreasing(lengths, row_lens)
    assert padding_efficiency(lengths, rows) >= padding_efficiency(lengths, reference)


def test_pack_windows_packs_a_paragraph_mix_at_90_percent_or_better():
    lengths = paragraph_lengths(np.random.default_rng(7), 5000)
    rows = pack_windows(lengths, row_lengths(256))
    assert_valid_plan(lengths, rows, row_lengths(256))
    assert padding_efficiency(lengths, rows) >= 0.9


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("mix", ["short", "long", "paragraphs", "just_over_half"])
def test_plan_rows_is_a_valid_plan_never_costlier_than_pack_windows(seed, mix):
    rng = np.random.default_rng(seed)
    row_lens = row_lengths(256)
    lengths = (rng.choice([34, 66, 70, 130], 600).tolist() if mix == "just_over_half"
               else random_lengths(rng, mix, 600))
    rows = plan_rows(lengths, row_lens)
    assert sorted(i for row in rows for i in row.windows) == list(range(len(lengths)))
    for row in rows:
        assert row.row_len in row_lens and sum(lengths[i] for i in row.windows) <= row.row_len
        assert 1 <= len(row.windows) <= max_segments_for(row.row_len)
    cost = lambda plan: sum(row_cost(row.row_len) for row in plan)
    assert cost(rows) <= cost(pack_windows(lengths, row_lens))
    assert plan_rows(np.array(lengths), row_lens) == rows  # deterministic


@pytest.mark.parametrize("window, efficiency", [(34, 0.9), (66, 0.75), (130, 0.75)])
def test_windows_just_over_a_row_lengths_half_fill_longer_rows(window, efficiency):
    """A 34-token window alone in a 64-token row (no second one fits) wasted half of every row; filling rows
    of 256 holds seven (three of 66; three 130-token windows a row of 512), at lower cost, with the same row
    lengths."""
    rows = plan_rows([window] * 1000, row_lengths(256))
    assert 1000 * window / sum(row.row_len for row in rows) >= efficiency
    assert padding_efficiency([window] * 1000, pack_windows([window] * 1000, row_lengths(256))) < 0.55


def test_pack_windows_puts_each_window_into_the_tightest_gap():
    lengths = [206, 98, 30, 25, 25]  # gaps of 50 (256 row) and 30 (128 row) when the 30 comes
    rows = pack_windows(lengths, (64, 128, 256))
    assert [(row.row_len, row.windows) for row in rows] == [(256, (0, 3, 4)), (128, (1, 2))]
    # First fit puts the 30 into the gap of 50, leaving 20 and 30 for the two 25s: a third row.
    assert len(first_fit_decreasing(lengths, (64, 128, 256))) == 3


def test_row_lengths_halve_down_to_64_and_keep_the_token_budget_per_call():
    assert row_lengths(256) == (64, 128, 256, 512)  # and twice max_len where there are several lengths
    assert row_lengths(512) == (64, 128, 256, 512, 1024) and row_lengths(1024)[-1] == 1024  # up to LONG_ROWS_UP_TO
    assert row_lengths(100) == (100,) and row_lengths(32) == (32,) and row_lengths(256, 256) == (256,)
    assert rows_per_call(64, 256, 16) == (64, 8)  # 4,096 tokens a full call at every row length
    assert rows_per_call(256, 256, 16) == (16, 2)
    assert rows_per_call(256, 256, 4, min_rows=4) == (4, 4)
    # rows of 512: no more [L, L] attention scores per call than 16 rows of 256 (the memory check's call)
    assert rows_per_call(512, 256, 16) == (4, 1) and 4 * 512 ** 2 <= 16 * 256 ** 2
    assert rows_per_call(512, 256, 16, min_rows=2) == (4, 2)
    # a call of one row of 512 would hold more scores than --batch_size 1-3 rows of 256: no such rows then
    assert row_lengths(256, batch_size=3) == (64, 128, 256) and row_lengths(256, batch_size=4)[-1] == 512
    assert row_lengths(256, batch_size=4, min_rows=2) == (64, 128, 256) and row_lengths(256, batch_size=8, min_rows=2)[-1] == 512


def test_call_sizes_use_two_shapes_and_cover_every_row():
    for n in range(0, 40):
        sizes = call_sizes(n, 8)
        assert sum(sizes) == n and set(sizes) <= {8, 1}
        sizes4 = call_sizes(n, 8, 4)
        assert 0 <= sum(sizes4) - n < 4 and set(sizes4) <= {8, 4}
    assert shapes_for(256, 16, 1) == {(4, 512), (1, 512), (16, 256), (2, 256), (32, 128), (4, 128), (64, 64), (8, 64)}
    assert call_sizes(13, 6, 4) == [6, 6, 4]  # a tail that does not divide the full call (--batch_size 17, 7, ...)
    with pytest.raises(ValueError, match="between 1 and"):
        call_sizes(5, 6, 7)
    with pytest.raises(ValueError, match="batch_size"):
        rows_per_call(64, 256, 6, min_rows=4)


def test_full_size_calls_only_give_one_shape_per_row_length_and_hold_every_row():
    """tail_fraction 1 (an accelerator's, batching.TAIL_CALL_FRACTION): what is left after the full calls runs in
    one more full-size call, so each row length compiles one program."""
    rows = pack_windows([5, 70, 130, 256, 200, 64, 33, 9] * 40, row_lengths(256, 256))
    for batch_size in (1, 3, 16, 17, 64):
        calls = plan_calls(rows, 256, batch_size, min_row_len=256, tail_fraction=1)
        assert {(size, row_len) for row_len, _, size in calls} == {(batch_size, 256)}
        assert shapes_for(256, batch_size, min_row_len=256, tail_fraction=1) == {(batch_size, 256)}
        assert sorted(r.windows for _, call_rows, _ in calls for r in call_rows) == sorted(r.windows for r in rows)
        assert len(calls) == -(-len(rows) // batch_size)  # padding fills the last call only
    assert rows_per_call(64, 256, 16, tail_fraction=1) == (64, 64)
    with pytest.raises(ValueError, match="tail_fraction"):
        rows_per_call(256, 256, 16, tail_fraction=0)


def test_every_batch_size_plans_calls_that_hold_every_row_in_the_bounded_shapes():
    """Any --batch_size (rounded up to a multiple of the devices, as run_model does) plans: --batch_size 17
    once made every document an infer error row, as its tail call did not divide its full call."""
    rows = pack_windows([5, 70, 130, 256, 200, 64, 33, 9] * 40, row_lengths(256))
    for devices in (1, 2, 3, 8):
        for batch_size in range(1, 130):
            batch_size = -(-batch_size // devices) * devices
            calls = plan_calls(rows, 256, batch_size, min_rows=devices)
            assert sorted(r.windows for _, call_rows, _ in calls for r in call_rows) == sorted(r.windows for r in rows)
            assert {(size, row_len) for row_len, _, size in calls} <= shapes_for(256, batch_size, devices)
            assert all(len(call_rows) <= size and size % devices == 0 for _, call_rows, size in calls)
            # no call holds more [L, L] attention scores than --batch_size rows of max_len (the memory check's)
            assert all(size * row_len ** 2 <= batch_size * 256 ** 2 for row_len, _, size in calls)


def test_run_packed_maps_each_segment_and_token_back_to_its_window():
    rng = np.random.default_rng(1)
    windows = [rng.integers(1, 1000, size=n).astype(np.int32) for n in (3, 40, 16, 17, 64, 5, 33, 2, 9, 12, 64, 30)]
    slots = max_segments_for(64)
    shapes = []

    def per_segment(input_ids, segment_ids):  # [B, slots, 2]: each segment's id sum and length
        shapes.append(input_ids.shape)
        out = np.zeros((input_ids.shape[0], slots, 2), np.float32)
        for s in range(slots):
            member = segment_ids == s + 1
            out[:, s, 0] = np.where(member, input_ids, 0).sum(axis=1)
            out[:, s, 1] = member.sum(axis=1)
        return out

    outputs, costs, totals = run_packed(windows, per_segment, max_len=64, batch_size=4)
    assert set(shapes) <= {(4, 64), (1, 64)}
    for w, out in zip(windows, outputs):
        assert out.tolist() == [float(w.sum()), float(len(w))]
    assert totals["calls"] == len(shapes)
    assert totals["real_tokens"] == sum(len(w) for w in windows)
    assert totals["computed_tokens"] == sum(b * n for b, n in shapes)
    assert sum(c.computed_tokens_per_row for c in costs) == pytest.approx(totals["computed_tokens"])
    assert sum(c.ms_per_row for c in costs) == pytest.approx(totals["ms"])

    # compiling is left out of the batch's time (its compile_ms): here "10 s" of it, more than the batch's wall
    clock = iter([0.0, 10.0])
    _, costs, totals = run_packed(windows, per_segment, max_len=64, batch_size=4, compiling_s=lambda: next(clock))
    assert totals["compile_ms"] == 10_000.0 and totals["ms"] == 0.0 and all(c.ms_per_row == 0.0 for c in costs)

    per_token, _, _ = run_packed(windows, lambda ids, seg: ids.astype(np.float32), max_len=64, batch_size=4,
                                 per_token=True)
    assert [o.tolist() for o in per_token] == [w.astype(np.float32).tolist() for w in windows]


@pytest.mark.parametrize("per_token", [False, True])
def test_a_nan_in_one_window_stays_in_that_window_when_rows_are_packed(per_token):
    """Attention weights a row-mate's values by 0, and 0 x NaN is NaN: a window whose values overflow to NaN made
    every window of its packed row NaN. The windows of such a row run again in halves, each in rows of its own,
    down to the bad one: only it keeps its NaN, the others get what they get without it, and each window's costs
    still add up to the batch's."""
    windows = [np.array(ids, np.int32) for ids in ([1, 2, 3], [4, 5], [6, 999, 7], [8, 9, 10, 11], [12, 13])]
    slots = max_segments_for(64)
    shapes = []

    def mixes_segments(input_ids, segment_ids):  # each position: the sum over its segment, as p @ v with p = 0 elsewhere
        shapes.append(input_ids.shape)
        values = np.where(input_ids == 999, np.nan, input_ids).astype(np.float32)
        same = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, :, None] > 0)
        per_position = np.einsum("rij,rj->ri", same.astype(np.float32), values)
        if per_token:
            return per_position
        first = [[int(np.argmax(row == s + 1)) for s in range(slots)] for row in segment_ids]
        return np.take_along_axis(per_position, np.array(first), axis=1)[:, :, None]

    outputs, costs, totals = run_packed(windows, mixes_segments, max_len=64, batch_size=4, per_token=per_token)
    for w, out in zip(windows, outputs):
        if 999 in w:
            assert np.isnan(out).all()
        else:
            assert np.asarray(out).ravel().tolist() == [float(w.sum())] * (len(w) if per_token else 1)
    # the packed row; its two halves (a row each); the NaN half's two halves (one of them the bad window alone)
    assert shapes == [(1, 64)] * 5 and totals["calls"] == 5
    assert 2 * sum(map(len, windows)) < totals["real_tokens"] < 3 * sum(map(len, windows))
    assert sum(c.ms_per_row for c in costs) == pytest.approx(totals["ms"])
    assert sum(c.computed_tokens_per_row for c in costs) == pytest.approx(totals["computed_tokens"])


def test_a_model_that_gives_nan_everywhere_reruns_each_window_about_log2_of_its_row_times():
    """Broken weights: every window NaN. Halving reruns a row's windows until each is alone, ceil(log2(n)) more
    runs of each (one window per row from the start would run 40 rows of 64 tokens for each packed row of 40
    windows: on an accelerator, rows of --max_seq_len each)."""
    windows = [np.array([1, 2, 3], np.int32) for _ in range(40)]  # 40 windows of 3 tokens: 2 rows of 64 (slots: 8)
    outputs, costs, totals = run_packed(windows, lambda ids, seg: np.full((ids.shape[0], 8, 1), np.nan, np.float32),
                                        max_len=64, batch_size=4)
    assert all(np.isnan(o).all() for o in outputs)
    first = totals["real_tokens"] / (1 + 3)  # each row of 8 windows: halved 8 -> 4 -> 2 -> 1, three more runs
    assert first == 3 * 40 and totals["real_tokens"] == 4 * first
    assert sum(c.ms_per_row for c in costs) == pytest.approx(totals["ms"])


def test_run_packed_over_several_row_lengths_maps_every_window_back():
    rng = np.random.default_rng(2)
    windows = [rng.integers(1, 1000, size=n).astype(np.int32) for n in rng.integers(2, 257, size=60)]
    shapes = []

    def per_segment(input_ids, segment_ids):  # [B, slots(row_len), 2]: each segment's id sum and length
        shapes.append(input_ids.shape)
        slots = max_segments_for(input_ids.shape[1])
        member = segment_ids[:, :, None] == np.arange(1, slots + 1)[None, None, :]
        return np.stack([np.where(member, input_ids[:, :, None], 0).sum(axis=1), member.sum(axis=1)], axis=-1)

    outputs, _, totals = run_packed(windows, per_segment, max_len=256, batch_size=4)
    assert {n for _, n in shapes} == {64, 128, 256} and set(shapes) <= shapes_for(256, 4)
    assert [o.tolist() for o in outputs] == [[int(w.sum()), len(w)] for w in windows]
    assert totals["real_tokens"] == sum(len(w) for w in windows)


@pytest.mark.integration
def test_packed_minilm_embeddings_equal_one_window_per_row(minilm):
    texts = SENTENCES + [LONG_TEXT]
    encoded = minilm.tokenizer.encode_windows(texts, max_len=TEST_MAX_LEN, stride=TEST_STRIDE, max_windows=8)
    windows = [w for doc in encoded for w in doc.windows]
    compiles_before = minilm.compile_count
    outputs, _, totals = run_model(minilm, windows, max_len=TEST_MAX_LEN, batch_size=TEST_BATCH)
    assert minilm.compile_count - compiles_before <= len(shapes_for(TEST_MAX_LEN, TEST_BATCH))
    rows = plan_rows([len(w) for w in windows], row_lengths(TEST_MAX_LEN))
    assert totals["computed_tokens"] == computed_tokens(rows, TEST_MAX_LEN, TEST_BATCH)
    np.testing.assert_allclose(pooled_by_doc(encoded, outputs), direct_embeddings(minilm, texts), atol=2e-5)


@pytest.mark.integration
def test_packed_minilm_embeddings_over_two_row_lengths_equal_one_window_per_row(minilm):
    texts = SENTENCES + [LONG_TEXT]  # short sentences go to 64-token rows, LONG_TEXT's windows to 128
    encoded = minilm.tokenizer.encode_windows(texts, max_len=128, stride=TEST_STRIDE, max_windows=8)
    windows = [w for doc in encoded for w in doc.windows]
    assert min(map(len, windows)) <= 64 < max(map(len, windows))
    outputs, _, _ = run_model(minilm, windows, max_len=128, batch_size=TEST_BATCH)
    np.testing.assert_allclose(pooled_by_doc(encoded, outputs), direct_embeddings(minilm, texts, max_len=128),
                               atol=2e-5)


@pytest.mark.integration
@pytest.mark.parametrize("words, window_range, longest_row", [
    (30, (32, 64), 128),  # windows just over half of 64: two or three share a 128-token row
    (52, (64, 128), 256),  # just over half of --max_seq_len 128: three share a row of 256 (twice max_len)
])
def test_windows_packed_into_longer_rows_than_their_own_give_the_same_embeddings(minilm, words, window_range,
                                                                                 longest_row):
    """Windows just over half a row length, where pack_windows gives each a row of its own: plan_rows puts two
    or three into a longer row (each segment's positions start at 0, so a row may be longer than the model's
    window), and each embedding is still the window's alone."""
    text_words = LONG_TEXT.split() * 20
    texts = [" ".join(text_words[i : i + words + i % 8]) for i in range(0, 480, 40)]
    encoded = minilm.tokenizer.encode_windows(texts, max_len=128, stride=TEST_STRIDE, max_windows=1)
    windows = [doc.windows[0] for doc in encoded]
    assert window_range[0] < min(map(len, windows)) and max(map(len, windows)) <= window_range[1]
    lengths = [len(w) for w in windows]
    rows = plan_rows(lengths, row_lengths(128))
    assert max(row.row_len for row in rows) == longest_row
    assert len(rows) < len(pack_windows(lengths, row_lengths(128))) == len(windows)
    outputs, _, _ = run_model(minilm, windows, max_len=128, batch_size=TEST_BATCH)
    np.testing.assert_allclose(pooled_by_doc(encoded, outputs), direct_embeddings(minilm, texts, max_len=128,
                                                                                  max_windows=1), atol=2e-5)


def test_sample_corpus_packs_at_90_percent_or_better(minilm):
    from pipeline.sample_data import sample_records

    texts = [r["text"] for r in sample_records()]
    encoded = minilm.tokenizer.encode_windows(texts, max_len=256, stride=32, max_windows=8)
    lengths = [len(w) for doc in encoded for w in doc.windows]
    rows = plan_rows(lengths, row_lengths(256))
    assert sum(lengths) / computed_tokens(rows, 256, 16) >= 0.9


def computed_tokens(rows, max_len: int, batch_size: int) -> int:
    """Tokens the model computes for a packing plan, padding included."""
    return sum(row_len * size for row_len, _, size in plan_calls(rows, max_len, batch_size))


def pooled_by_doc(encoded, outputs) -> np.ndarray:
    """Each document's embedding from its windows' outputs (windows in document order)."""
    pooled, k = [], 0
    for doc in encoded:
        pooled.append(pool_windows(outputs[k:k + len(doc.windows)]))
        k += len(doc.windows)
    return np.stack(pooled)


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["cpu", "gpu", "tpu"])
def test_run_model_packs_the_rows_of_the_backends_batch_settings(minilm, monkeypatch, backend):
    """run_model with a backend's BatchSettings (pipeline/stages/batching.py MIN_ROW_LEN, TAIL_CALL_FRACTION), as
    graph.py passes them: short rows and small tail calls on a CPU; on an accelerator rows of max_len only, the
    length its kernel was chosen for when the model loaded (a sliding window dropped there as masking nothing,
    kernels/interface.py effective_window, is never needed by a longer row), in full-size calls only: one
    compiled program."""
    settings = batching.settings_for(backend)
    texts = (SENTENCES + [LONG_TEXT]) * 4  # rows for more than one call
    encoded = minilm.tokenizer.encode_windows(texts, max_len=128, stride=TEST_STRIDE, max_windows=8)
    windows = [w for doc in encoded for w in doc.windows]
    shapes, start = [], minilm.start

    def recording_start(method, input_ids, segment_ids, *static):
        shapes.append(input_ids.shape)
        return start(method, input_ids, segment_ids, *static)

    monkeypatch.setattr(minilm, "start", recording_start)
    outputs, _, _ = run_model(minilm, windows, max_len=128, batch_size=TEST_BATCH, min_row_len=settings.shortest_row(128),
                              tail_fraction=settings.tail_call_fraction)
    if backend == "cpu":
        assert min(n for _, n in shapes) < 128
        assert any(rows < TEST_BATCH * 128 // n for rows, n in shapes if n <= 128)  # a tail call
    else:
        assert set(shapes) == {(TEST_BATCH, 128)} and len(shapes) > 1
    np.testing.assert_allclose(pooled_by_doc(encoded, outputs), direct_embeddings(minilm, texts, max_len=128),
                               atol=2e-5)


def _segment_sums_nan_at_999(calls):
    """A fake model: each segment's id sum, as p @ v with p = 0 outside the segment, so a 999 token (NaN) makes
    its whole packed row NaN; records each call's shape and whether it held the 999."""
    def model(input_ids, segment_ids):
        calls.append((input_ids.shape, bool((input_ids == 999).any())))
        slots = max_segments_for(input_ids.shape[1])
        values = np.where(input_ids == 999, np.nan, input_ids).astype(np.float32)
        same = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, :, None] > 0)
        per_position = np.einsum("rij,rj->ri", same.astype(np.float32), values)
        first = [[int(np.argmax(row == s + 1)) for s in range(slots)] for row in segment_ids]
        return np.take_along_axis(per_position, np.array(first), axis=1)[:, :, None]
    return model


def test_a_nan_in_an_early_call_reruns_its_row_even_when_the_last_call_is_clean():
    """Whether a batch saw a NaN is gathered over all of its calls: a NaN row in the first call (the 64-token
    rows run before the 128-token ones) must still be rerun in halves when the last call comes back clean,
    or the innocent window packed with the bad one is published as a nan_output error row."""
    windows = [np.array([1, 2, 3], np.int32), np.array([4, 999, 5], np.int32),  # share a 64-token row
               np.arange(1, 127, dtype=np.int32), np.arange(2, 128, dtype=np.int32)]  # a 128-token row each
    calls = []
    outputs, _, totals = run_packed(windows, _segment_sums_nan_at_999(calls), max_len=128, batch_size=1)
    assert calls[:3] == [((1, 64), True), ((1, 128), False), ((1, 128), False)]  # the NaN is not in the last call
    assert np.isnan(outputs[1]).all()
    assert [float(outputs[i][0]) for i in (0, 2, 3)] == [6.0, float(windows[2].sum()), float(windows[3].sum())]
    assert totals["calls"] == 4  # the rerun: the two windows of the NaN row, each in a row of its own


def test_a_row_of_exactly_two_windows_with_one_nan_is_rerun():
    """The smallest row worth rerunning holds two windows: its NaN window is cornered by one halving, and the
    innocent row-mate gets its own value instead of the NaN (a nan_output error row)."""
    windows = [np.array([1, 2, 3], np.int32), np.array([4, 999], np.int32)]
    calls = []
    outputs, _, totals = run_packed(windows, _segment_sums_nan_at_999(calls), max_len=64, batch_size=4)
    assert calls[0] == ((1, 64), True)  # one packed row of both windows
    assert outputs[0].tolist() == [6.0] and np.isnan(outputs[1]).all()
    assert totals["calls"] == 3  # the packed row, then each window alone (tail calls of one row)
