"""GPU attention kernels on a GPU machine: which kernel flash picks, parity, time and memory per length.

Sections, in order, each case on its own (a failing case is printed and recorded, never ends the run):
  checks    flash/auto resolve to cudnn for padded rows and to pallas_gpu for packed ones, and the
            compiled programs call cuDNN / Triton; float32 is refused by both.
  parity    xla, cudnn, pallas_gpu, blockwise against a float32 reference at precision "highest"
            (itself checked against the float64 NumPy reference at the shortest length), 1k-32k tokens,
            rows with padding, packed segments, none; causal and grouped-query; bf16 bound 2e-2.
  timing    ms per kernel per length (batch 1, 12 heads, head_dim 64, bf16), plain and causal;
            flash = cudnn on padded rows, pallas_gpu on packed rows; goals: flash >= 3x xla at 8k and
            never slower than xla from 2k. The compiled memory (memory_analysis) of each program,
            and temp bytes 32k/16k per kernel (2 = linear in length, 4 = quadratic).
  pipeline  the pipeline's row shapes (MiniLM: 12 heads, head_dim 32): xla, pallas_gpu, cudnn on one
            document per row, and cudnn with a dense [B,1,L,L] mask as it was before (for comparison).
  precision float32 at docscore's matmul precisions (models/precision.py: "highest" for --dtype float32,
            TF32_TF32_F32 for --matmul_precision tf32) and XLA's "default": at the pipeline's shapes, the
            model's dense matmuls (MiniLM's and BERT-base's) and xla attention, ms and error (matmuls against
            float64, attention against the float32 "highest" reference), tf32/highest speed-up; then xla
            attention at 1k against float64 (default / tf32 / highest).
  tiles     pallas_gpu at 8k with a few block sizes / warps / stages (for tuning kernels/pallas_gpu.py).
--sections runs only the named sections, in the order given (default: all, in the order above); timing
takes --lengths and --timing-causal (some: causal at 2k, 8k and 32k only; all; none; only).
Stops starting new cases after --budget-s seconds (default 130, so the whole run stays under 150 s on
an H200 including compiles) and says what it skipped. Prints markdown tables; writes JSON to
$OUT/gpu_kernels.json when OUT is set (or --json PATH). Exits 1 when a check or parity case fails, 2
without a GPU (unless --quick). Run from the repository root:

  python benchmarks/gpu_kernels.py              # on the GPU machine (jax[cuda])
  python benchmarks/gpu_kernels.py --quick      # anywhere: small shapes; on CPU Pallas runs in its
                                                # interpreter and cudnn's adapter on jax's XLA path
                                                # (tf32 is a GPU format: reported unsupported there)
  # what the 2026-12-04 H200 run left unmeasured (benchmarks/RESULTS.md, "GPU: what the next session runs"):
  python benchmarks/gpu_kernels.py --sections precision pipeline timing --lengths 8192 16384 32768 \
      --timing-causal all --repeats 5 --budget-s 420
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

PROCESS_START = time.perf_counter()  # the budget counts jax's import and device start-up too
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from kernels import KernelUnsupportedError, attention, resolve  # noqa: E402
from kernels.cudnn import cudnn_attention  # noqa: E402
from kernels.masking import allowed  # noqa: E402
from kernels.pallas_gpu import pallas_gpu_attention  # noqa: E402
from kernels.reference import reference_attention  # noqa: E402
from models.precision import CHOICES, with_matmul_precision  # noqa: E402

BF16_TOLERANCE = 2e-2  # the contract's bfloat16 bound against the reference
F32_TOLERANCE = 2e-5
KERNELS = ("xla", "cudnn", "pallas_gpu", "blockwise")
XLA_MEMORY_SHARE = 0.5  # skip xla where its estimated scores would take more of the device than this
# float32 matmul precisions compared: docscore's two named choices (models/precision.py) and XLA's default
PRECISIONS = (("highest", CHOICES["float32"]), ("tf32", CHOICES["tf32"]), ("default", "default"))
# The dense matmuls of one pipeline call, [tokens, in] x [in, out]: MiniLM (hidden 384: q/k/v, FFN up and
# down) and BERT-base (hidden 768: FFN up); tokens = a call's rows x length (128 x 256 = 16 x 2048).
DENSE_SHAPES = (("minilm qkv", 384, 1152), ("minilm ffn up", 384, 1536), ("minilm ffn down", 1536, 384),
                ("bert-base ffn up", 768, 3072))


class Run:
    """Shapes for this run, the deadline, and everything measured (the JSON)."""

    def __init__(self, args):
        self.emulate = jax.default_backend() != "gpu"  # CPU --quick: interpreted Pallas, cudnn via XLA
        self.quick = args.quick
        self.repeats = args.repeats
        self.timing_causal = args.timing_causal
        self.deadline = PROCESS_START + args.budget_s
        self.started = PROCESS_START
        if args.quick:
            self.heads, self.head_dim = 4, 32
            self.parity_lengths, self.timing_lengths = (128, 256), (128, 256, 512)
            self.pipeline_shapes = ((8, 128),)
        else:
            self.heads, self.head_dim = 12, 64
            self.parity_lengths = (1024, 4096, 16384, 32768)
            self.timing_lengths = tuple(args.lengths)
            self.pipeline_shapes = ((128, 256), (16, 2048))
        device = jax.devices()[0]
        stats = device.memory_stats() if hasattr(device, "memory_stats") else None
        self.bytes_limit = (stats or {}).get("bytes_limit")
        self.results = {"env": {"jax": jax.__version__, "backend": jax.default_backend(),
                                "device": device.device_kind, "emulated": self.emulate,
                                "quick": self.quick, "bytes_limit": self.bytes_limit},
                        "checks": [], "parity": [], "timing": [], "memory": [], "pipeline": [],
                        "precision": [], "tiles": [], "goals": [], "skipped": [], "failures": []}

    def out_of_time(self, what: str) -> bool:
        if time.perf_counter() < self.deadline:
            return False
        self.results["skipped"].append(what)
        return True

    def fail(self, message: str) -> None:
        self.results["failures"].append(message)
        print(f"FAIL: {message}", flush=True)

    def xla_fits(self, batch: int, length: int) -> bool:
        need = 3 * batch * self.heads * length * length * 4  # float32 scores, softmax, probs
        limit = self.bytes_limit or 16 * 2**30
        return need <= XLA_MEMORY_SHARE * limit


def rows(kind: str, batch: int, length: int) -> np.ndarray | None:
    """Segment ids [batch, length]. padded: one segment per row (row 0 full, then 60%, then 1 token,
    then all padding); packed: several segments per row (5 then padding; 5 filling the row with a
    one-token segment; 3 then padding ...); none: no segment ids."""
    if kind == "none":
        return None
    seg = np.zeros((batch, length), np.int32)
    for row in range(batch):
        if kind == "padded":
            seg[row, :(length, length * 3 // 5, 1, 0)[row % 4]] = 1
            continue
        pattern = ((0, .1, .35, .4, .7, .9), (0, .25, .5, None, .8, 1.0), (0, .3, .6, .75))[row % 3]
        bounds = [int(f * length) if f is not None else int(.5 * length) + 1 for f in pattern]
        for segment, (start, end) in enumerate(zip(bounds[:-1], bounds[1:]), start=1):
            seg[row, start:end] = segment
    return seg


def inputs(seed: int, batch: int, length: int, heads: int, kv_heads: int, head_dim: int,
           dtype=jnp.bfloat16):
    keys = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(keys[0], (batch, length, heads, head_dim), jnp.float32).astype(dtype)
    k = jax.random.normal(keys[1], (batch, length, kv_heads, head_dim), jnp.float32).astype(dtype)
    v = jax.random.normal(keys[2], (batch, length, kv_heads, head_dim), jnp.float32).astype(dtype)
    return q, k, v


def kernel_fn(run: Run, name: str, causal: bool, packed: bool):
    """(q, k, v, seg) -> out for one kernel: through attention() on a GPU; on CPU (--quick) pallas_gpu
    interpreted and cudnn's adapter on jax's XLA path, called directly (the policy refuses them there)."""
    if run.emulate and name == "pallas_gpu":
        return lambda q, k, v, s: pallas_gpu_attention(q, k, v, segment_ids=s, causal=causal,
                                                       interpret=True)
    if run.emulate and name == "cudnn":
        if packed:  # what attention() would refuse on a GPU
            resolve("cudnn", backend="gpu", dtype="bfloat16", has_segments=True, packed=True)
        return lambda q, k, v, s: cudnn_attention(q, k, v, segment_ids=s, causal=causal,
                                                  implementation="xla")
    return lambda q, k, v, s: attention(q, k, v, segment_ids=s, causal=causal, impl=name,
                                        packed=packed)


def device_reference(q, k, v, seg, causal: bool, chunk: int = 1024):
    """Contract attention in float32 at precision "highest" (no TF32), one query chunk at a time so
    memory is chunk x length; the shared mask from kernels/masking.py."""
    batch, length, heads, head_dim = q.shape
    groups = heads // k.shape[2]
    chunk = math.gcd(length, chunk)
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
    seg_all = None if seg is None else seg
    positions = jnp.arange(length)
    highest = jax.lax.Precision.HIGHEST

    def one_chunk(i):
        qc = jax.lax.dynamic_slice_in_dim(q, i * chunk, chunk, axis=1)
        q_pos = i * chunk + jnp.arange(chunk)
        q_seg = None if seg is None else jax.lax.dynamic_slice_in_dim(seg, i * chunk, chunk, axis=1)
        scores = jnp.einsum("bqhd,bkhd->bhqk", qc, k, precision=highest) * head_dim ** -0.5
        mask = allowed(q_seg, seg_all, q_pos, positions, causal)
        if mask is None:
            mask = jnp.ones((1, chunk, length), bool)
        mask = mask[:, None]
        scores = jnp.where(mask, scores, -jnp.inf)
        top = jnp.max(scores, axis=-1, keepdims=True)
        top = jnp.where(jnp.isfinite(top), top, 0.0)
        weights = jnp.where(mask, jnp.exp(scores - top), 0.0)
        total = jnp.sum(weights, axis=-1, keepdims=True)
        probs = weights / jnp.where(total == 0.0, 1.0, total)
        return jnp.einsum("bhqk,bkhd->bqhd", probs, v, precision=highest)

    out = jax.lax.map(one_chunk, jnp.arange(length // chunk))  # [chunks, B, chunk, H, D]
    return out.transpose(1, 0, 2, 3, 4).reshape(batch, length, heads, head_dim)


@jax.jit
def compare(out, ref, seg):
    """(max abs error, any NaN, padding rows all exactly 0) on the device."""
    out = out.astype(jnp.float32)
    err = jnp.max(jnp.where(jnp.isnan(out), jnp.inf, jnp.abs(out - ref)))
    pad_ok = jnp.all(jnp.where((seg == 0)[:, :, None, None], out == 0, True))
    return err, jnp.any(jnp.isnan(out)), pad_ok


def check_choices(run: Run) -> None:
    """flash and auto choose by what the inputs need; explicit impossible choices are refused."""
    length = 16384  # cudnn refused segments here before (dense mask)
    info = dict(dtype="bfloat16", head_dim=run.head_dim, q_len=length, kv_len=length,
                has_segments=True)
    expected = [("flash", "one segment a row", dict(packed=False), "cudnn"),
                ("flash", "packed segments", {}, "pallas_gpu"),
                ("auto", "one segment a row", dict(packed=False), "cudnn"),
                ("auto", "packed segments", {}, "pallas_gpu"),
                ("flash", "no segment ids", dict(has_segments=False), "cudnn")]
    for impl, rows_kind, extra, want in expected:
        got = resolve(impl, backend="gpu", **{**info, **extra})
        ok = got == want
        check = f"{impl}, {rows_kind}, {length} tokens"
        run.results["checks"].append(dict(check=check, got=got, ok=ok))
        if not ok:
            run.fail(f"{check} resolved to {got}, not {want}")
    for impl in ("cudnn", "pallas_gpu"):
        try:
            resolve(impl, backend="gpu", dtype="float32")
            run.fail(f"{impl} accepted float32")
        except KernelUnsupportedError as error:
            run.results["checks"].append(dict(check=f"{impl} float32 refused", got=str(error), ok=True))
    if run.emulate:
        return
    q, k, v = inputs(0, 2, 512, run.heads, run.heads, run.head_dim)
    seg = jnp.asarray(rows("padded", 2, 512))
    for packed, want, marker in ((False, "cudnn", "cudnn"), (True, "pallas_gpu", "triton")):
        try:
            lowered = jax.jit(lambda q, k, v, s, p=packed: attention(
                q, k, v, segment_ids=s, impl="flash", packed=p)).lower(q, k, v, seg)
            in_scope = f"attention/{want}" in lowered.as_text(debug_info=True)
            calls = marker in lowered.compile().as_text().lower()
            run.results["checks"].append(dict(check=f"flash packed={packed} compiles to {want}",
                                              got=dict(scope=in_scope, call=calls), ok=in_scope and calls))
            if not (in_scope and calls):
                run.fail(f"flash packed={packed}: scope attention/{want} {in_scope}, {marker} call {calls}")
        except Exception as error:  # noqa: BLE001 - a failing case is recorded, never ends the run
            run.fail(f"flash packed={packed} did not compile: {type(error).__name__}: {str(error)[:300]}")


def print_checks(run: Run) -> None:
    print("\n## kernel choice on gpu\n")
    for check in run.results["checks"]:
        got = check["got"] if len(str(check["got"])) < 120 else str(check["got"])[:117] + "..."
        print(f"- {check['check']}: {got} {'ok' if check['ok'] else 'FAIL'}")


def check_parity(run: Run) -> None:
    cases = []
    for i, length in enumerate(run.parity_lengths):
        for j, (kind, causal) in enumerate((("padded", i % 2 == 0), ("packed", i % 2 == 1))):
            cases.append((length, kind, causal, (run.heads, max(1, run.heads // 3))[(i + j) % 2]))
    cases.insert(1, (run.parity_lengths[0], "none", True, run.heads))
    print(f"\n## parity (batch 4 to 4k, 2 above; {run.heads} heads, head_dim {run.head_dim}, bf16; max abs error "
          f"against the float32 'highest' reference; bound {BF16_TOLERANCE})\n")
    print("| length | rows | causal | kv_heads | " + " | ".join(KERNELS) + " |")
    print("|---|---|---|---|" + "---|" * len(KERNELS))
    for index, (length, kind, causal, kv_heads) in enumerate(cases):
        if run.out_of_time(f"parity {length} {kind} causal={causal}"):
            continue
        batch = 4 if length <= 4096 else 2  # 4 rows: every row pattern, all-padding rows included
        seg_np = rows(kind, batch, length)
        seg = None if seg_np is None else jnp.asarray(seg_np)
        q, k, v = inputs(index, batch, length, run.heads, kv_heads, run.head_dim)
        try:
            ref = jax.jit(lambda q, k, v, s: device_reference(q, k, v, s, causal))(q, k, v, seg)
            if index == 0:  # the float32 reference against the float64 NumPy one
                exact = reference_attention(*(np.asarray(x.astype(jnp.float32)) for x in (q, k, v)),
                                            segment_ids=seg_np, causal=causal)
                ref_err = float(np.abs(np.asarray(ref, np.float64) - exact).max())
                run.results["parity"].append(dict(length=length, rows=kind, causal=causal,
                                                  kv_heads=kv_heads, kernel="reference_f32",
                                                  error=ref_err, ok=ref_err <= 1e-4))
                if ref_err > 1e-4:
                    run.fail(f"float32 reference differs from float64 by {ref_err:.1e}")
        except Exception as error:  # noqa: BLE001
            run.fail(f"reference at {length} {kind}: {type(error).__name__}: {str(error)[:300]}")
            continue
        cells = []
        seg_for_compare = seg if seg is not None else jnp.ones((batch, length), jnp.int32)
        for name in KERNELS:
            entry = dict(length=length, rows=kind, causal=causal, kv_heads=kv_heads, kernel=name)
            if run.out_of_time(f"parity {name} {length} {kind} causal={causal}"):
                cells.append("skipped")
                continue
            if name == "xla" and not run.xla_fits(batch, length):
                entry.update(status="skipped: scores would not fit")
                cells.append("skip (memory)")
                run.results["parity"].append(entry)
                continue
            try:
                fn = jax.jit(kernel_fn(run, name, causal, packed=kind == "packed"))
                err, nan, pad_ok = (x.item() for x in compare(fn(q, k, v, seg), ref, seg_for_compare))
                ok = err <= BF16_TOLERANCE and not nan and pad_ok
                entry.update(error=err, nan=nan, padding_rows_zero=pad_ok, ok=ok)
                cells.append(f"{err:.1e}" + ("" if ok else " FAIL"))
                if not ok:
                    run.fail(f"{name} at {length} {kind} causal={causal} kv_heads={kv_heads}: error "
                             f"{err:.1e}, NaN {nan}, padding rows zero {pad_ok}")
            except KernelUnsupportedError as error:  # expected: cudnn on packed rows
                entry.update(status=f"refused: {error}")
                cells.append("refused")
            except Exception as error:  # noqa: BLE001
                entry.update(status=f"error: {type(error).__name__}: {str(error)[:300]}")
                cells.append("ERROR")
                run.fail(f"{name} at {length} {kind} causal={causal}: {entry['status']}")
            run.results["parity"].append(entry)
        print(f"| {length} | {kind} | {causal} | {kv_heads} | " + " | ".join(cells) + " |", flush=True)


def time_compiled(run: Run, fn, args) -> dict:
    """Compile (timed), then the median of `repeats` calls, and the program's compiled memory."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - start
    compiled(*args).block_until_ready()
    times = []
    for _ in range(run.repeats):
        start = time.perf_counter()
        compiled(*args).block_until_ready()
        times.append(time.perf_counter() - start)
    result = dict(ms=statistics.median(times) * 1e3, compile_s=compile_s)
    try:
        memory = compiled.memory_analysis()
        result.update(temp_bytes=int(memory.temp_size_in_bytes),
                      argument_bytes=int(memory.argument_size_in_bytes),
                      output_bytes=int(memory.output_size_in_bytes))
    except Exception:  # noqa: BLE001 - not every backend reports it
        pass
    return result


def timing(run: Run) -> None:
    heads, head_dim = run.heads, run.head_dim
    label = " (interpreted/emulated on CPU: not GPU times)" if run.emulate else ""
    print(f"\n## timing, ms (batch 1, {heads} heads, head_dim {head_dim}, bf16, median of "
          f"{run.repeats}){label}; flash = cudnn on padded rows, pallas_gpu on packed rows\n")
    print("| length | causal | xla | cudnn (padded) | pallas_gpu (packed) | blockwise | xla/cudnn | "
          "xla/pallas_gpu |")
    print("|---|---|---|---|---|---|---|---|")
    lengths = run.timing_lengths
    plain = [] if run.timing_causal == "only" else [(length, False) for length in lengths]
    causal_lengths = {"some": [n for n in lengths if n in (2048, 8192, 32768) or run.quick],
                      "all": list(lengths), "only": list(lengths), "none": []}[run.timing_causal]
    plan = plain + [(length, True) for length in causal_lengths]
    blockwise_at = {lengths[len(lengths) // 2], lengths[-1]}
    for length, causal in plan:
        row = {}
        q, k, v = inputs(1, 1, length, heads, heads, head_dim)
        padded = jnp.asarray(rows("padded", 1, length))  # one segment: the whole row
        packed = jnp.asarray(rows("packed", 1, length))
        for name in KERNELS:
            if name == "blockwise" and length not in blockwise_at:
                continue
            if run.out_of_time(f"timing {name} {length} causal={causal}"):
                continue
            entry = dict(length=length, causal=causal, kernel=name,
                         rows="padded" if name == "cudnn" else "packed")
            if name == "xla" and not run.xla_fits(1, length):
                entry.update(status="skipped: scores would not fit")
                run.results["timing"].append(entry)
                continue
            seg = padded if name == "cudnn" else packed
            try:
                entry.update(time_compiled(run, kernel_fn(run, name, causal, packed=name != "cudnn"),
                                           (q, k, v, seg)))
                row[name] = entry["ms"]
            except Exception as error:  # noqa: BLE001
                entry.update(status=f"error: {type(error).__name__}: {str(error)[:300]}")
                print(f"<!-- {name} at {length}: {entry['status']} -->")
            run.results["timing"].append(entry)
        fmt = lambda name: f"{row[name]:.2f}" if name in row else "-"
        ratio = lambda a, b: f"{row[a] / row[b]:.2f}" if a in row and b in row else "-"
        print(f"| {length} | {causal} | {fmt('xla')} | {fmt('cudnn')} | {fmt('pallas_gpu')} | "
              f"{fmt('blockwise')} | {ratio('xla', 'cudnn')} | {ratio('xla', 'pallas_gpu')} |",
              flush=True)
    goals(run)
    memory_table(run)


def goals(run: Run) -> None:
    """flash >= 3x xla at 8k; flash never slower than xla from 2k (not causal), per kind of row."""
    times = {(e["kernel"], e["length"]): e["ms"] for e in run.results["timing"]
             if not e["causal"] and "ms" in e}
    for flash, rows_kind in (("cudnn", "padded"), ("pallas_gpu", "packed")):
        at_8k = [times[(n, 8192)] for n in ("xla", flash) if (n, 8192) in times]
        if len(at_8k) == 2:
            speedup = at_8k[0] / at_8k[1]
            run.results["goals"].append(dict(goal=f"{flash} ({rows_kind}) >= 3x xla at 8k",
                                             value=round(speedup, 2), met=speedup >= 3))
        slower = [length for (name, length), ms in times.items() if name == flash and length >= 2048
                  and (("xla", length) in times) and ms > times[("xla", length)]]
        compared = [length for (name, length) in times if name == flash and length >= 2048
                    and ("xla", length) in times]
        if compared:
            run.results["goals"].append(dict(goal=f"{flash} ({rows_kind}) never slower than xla from 2k",
                                             value=sorted(slower) or "never", met=not slower))
    for goal in run.results["goals"]:
        print(f"goal {goal['goal']}: {goal['value']} -> {'met' if goal['met'] else 'MISSED'}")


def memory_table(run: Run) -> None:
    """Compiled temp bytes per kernel and length; the ratio between the two longest lengths."""
    entries = [e for e in run.results["timing"] if "temp_bytes" in e and not e["causal"]]
    if not entries:
        return
    print("\n## compiled memory (temp bytes, MiB; not causal)\n")
    print("| kernel | rows | " + " | ".join(str(n) for n in run.timing_lengths) + " | longest/previous |")
    print("|---|---|" + "---|" * (len(run.timing_lengths) + 1))
    for name in KERNELS:
        mine = {e["length"]: e["temp_bytes"] for e in entries if e["kernel"] == name}
        if not mine:
            continue
        cells = [f"{mine[n] / 2**20:.1f}" if n in mine else "-" for n in run.timing_lengths]
        known = sorted(mine)
        growth = None
        if len(known) >= 2 and mine[known[-2]]:
            growth = mine[known[-1]] / mine[known[-2]]
        rows_kind = "padded" if name == "cudnn" else "packed"
        run.results["memory"].append(dict(kernel=name, rows=rows_kind, temp_bytes=mine,
                                          longest_over_previous=growth,
                                          lengths=known[-2:] if growth else known))
        cells.append("-" if growth is None else f"{growth:.2f}x for {known[-1] / known[-2]:g}x length")
        print(f"| {name} | {rows_kind} | " + " | ".join(cells) + " |")
    if not run.emulate:
        stats = jax.devices()[0].memory_stats() or {}
        run.results["env"]["peak_bytes_in_use"] = stats.get("peak_bytes_in_use")
        print(f"device peak bytes in use this process: {stats.get('peak_bytes_in_use')}")


def pipeline_shapes(run: Run) -> None:
    """MiniLM's attention on the pipeline's rows: packed windows (xla, pallas_gpu, the old cudnn with
    a dense mask) and one document per row (cudnn with lengths)."""
    heads, head_dim = 12, 32
    print(f"\n## pipeline row shapes, ms ({heads} heads, head_dim {head_dim}, bf16, not causal)\n")
    print("| batch x length | xla (packed) | pallas_gpu (packed) | cudnn dense mask (packed, before) "
          "| cudnn lengths (one doc a row) |")
    print("|---|---|---|---|---|")
    for batch, length in run.pipeline_shapes:
        q, k, v = inputs(2, batch, length, heads, heads, head_dim)
        packed = jnp.asarray(rows("packed", batch, length))
        padded = jnp.asarray(rows("padded", batch, length))
        cases = [("xla", kernel_fn(run, "xla", False, True), packed),
                 ("pallas_gpu", kernel_fn(run, "pallas_gpu", False, True), packed),
                 ("cudnn_dense_mask", dense_mask_cudnn(run), packed),
                 ("cudnn", kernel_fn(run, "cudnn", False, False), padded)]
        cells = []
        for name, fn, seg in cases:
            if run.out_of_time(f"pipeline {name} {batch}x{length}"):
                cells.append("skipped")
                continue
            entry = dict(batch=batch, length=length, kernel=name)
            try:
                entry.update(time_compiled(run, fn, (q, k, v, seg)))
                cells.append(f"{entry['ms']:.3f}")
            except Exception as error:  # noqa: BLE001
                entry.update(status=f"error: {type(error).__name__}: {str(error)[:300]}")
                cells.append("error")
            run.results["pipeline"].append(entry)
        print(f"| {batch}x{length} | " + " | ".join(cells) + " |", flush=True)


def dense_mask_cudnn(run: Run):
    """What cudnn did before this change: segment ids as a dense [B, 1, L, L] mask."""
    implementation = "xla" if run.emulate else "cudnn"

    def call(q, k, v, seg):
        mask = allowed(seg, seg, jnp.arange(seg.shape[1]), jnp.arange(seg.shape[1]), False)[:, None]
        out = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=implementation)
        return jnp.where((seg != 0)[:, :, None, None], out, 0)
    return call


TILES = ((128, 128, None, 2), (128, 64, 4, 3), (64, 64, 4, 2), (128, 128, 8, 3))


def pallas_tiles(run: Run) -> None:
    """pallas_gpu's time at 8k (packed rows, not causal) for a few tile settings (block_q, block_k,
    num_warps, num_stages); the first is the default kernels/pallas_gpu.py uses."""
    length = 8192 if not run.quick else 256
    q, k, v = inputs(4, 1, length, run.heads, run.heads, run.head_dim)
    seg = jnp.asarray(rows("packed", 1, length))
    print(f"\n## pallas_gpu tiles at {length} tokens (packed, not causal), ms\n")
    for block_q, block_k, warps, stages in TILES:
        label = f"block_q {block_q}, block_k {block_k}, num_warps {warps or 'default'}, num_stages {stages}"
        if run.out_of_time(f"tiles {label}"):
            continue
        fn = lambda q, k, v, s, bq=block_q, bk=block_k, w=warps, st=stages: pallas_gpu_attention(
            q, k, v, segment_ids=s, block_q=bq, block_k=bk, num_warps=w, num_stages=st,
            interpret=run.emulate)
        entry = dict(length=length, block_q=block_q, block_k=block_k, num_warps=warps,
                     num_stages=stages)
        try:
            entry.update(time_compiled(run, fn, (q, k, v, seg)))
            print(f"- {label}: {entry['ms']:.3f}")
        except Exception as error:  # noqa: BLE001
            entry.update(status=f"error: {type(error).__name__}: {str(error)[:300]}")
            print(f"- {label}: {entry['status']}")
        run.results["tiles"].append(entry)


def precision(run: Run) -> None:
    """float32 at each of PRECISIONS: the pipeline's dense matmuls and xla attention (ms, error, tf32 and
    default speed-up over highest), then xla attention at 1k against float64."""
    dense_precision(run)
    attention_precision(run)
    attention_precision_long(run)
    highest = [e for e in run.results["precision"]
               if e.get("case") == "attention float64" and e["matmul_precision"] == "highest"]
    if highest and not highest[0]["within_f32_bound"]:
        run.fail(f"float32 at precision highest is off by {highest[0]['error']:.1e}")


def _precision_call(run: Run, entry: dict, fn, setting: str, args) -> None:
    """Time `fn` traced under jax.default_matmul_precision(setting) into `entry`, and say whether the
    compiled program names tf32; a backend that has no such precision is recorded, not failed."""
    try:
        entry.update(time_compiled(run, with_matmul_precision(fn, setting), args))
        if not run.emulate:
            text = jax.jit(with_matmul_precision(fn, setting)).lower(*args).compile().as_text().lower()
            entry["compiled_names_tf32"] = "tf32" in text
    except Exception as error:  # noqa: BLE001 - e.g. TF32_TF32_F32 on CPU ("not supported by dot_general")
        entry.update(status=f"unsupported: {type(error).__name__}: {str(error)[:200]}")


def _speedups(row: dict) -> str:
    base = row.get("highest", {}).get("ms")
    return " | ".join(f"{base / row[n]['ms']:.2f}" if base and "ms" in row.get(n, {}) else "-"
                      for n in ("tf32", "default"))


def precision_cells(run: Run, base: dict, what: str, fn, args: tuple, error) -> str:
    """One table row's cells: `fn(*args)` timed at each of PRECISIONS with error(setting) beside it, each
    entry (`base` + the precision) added to run.results["precision"], then the speed-ups."""
    row, cells = {}, []
    for label, setting in PRECISIONS:
        entry = dict(base, matmul_precision=label, setting=setting)
        if run.out_of_time(f"precision {what} {label}"):
            cells += ["skipped", "-"]
            continue
        _precision_call(run, entry, fn, setting, args)
        if "ms" in entry:
            entry["error"] = error(setting)
            cells += [f"{entry['ms']:.3f}", f"{entry['error']:.1e}"]
        else:
            cells += ["unsupported", "-"]
        row[label] = entry
        run.results["precision"].append(entry)
    return " | ".join(cells) + f" | {_speedups(row)} |"


def dense_precision(run: Run) -> None:
    """The model's dense matmuls at a pipeline call's size, float32: ms per precision and the max error
    relative to max |exact| over the first 256 rows against float64 NumPy."""
    tokens = 32768 if not run.quick else 1024
    print(f"\n## float32 dense matmuls at the pipeline's size ([{tokens}, in] x [in, out]; ms, max error / "
          f"max |exact| over 256 rows against float64)\n")
    print("| matmul | " + " | ".join(f"{n} ms | {n} error" for n, _ in PRECISIONS)
          + " | highest/tf32 | highest/default |")
    print("|---|" + "---|---|" * len(PRECISIONS) + "---|---|")
    for index, (name, n_in, n_out) in enumerate(DENSE_SHAPES):
        keys = jax.random.split(jax.random.key(10 + index), 2)
        x = jax.random.normal(keys[0], (tokens, n_in), jnp.float32)
        w = jax.random.normal(keys[1], (n_in, n_out), jnp.float32) * 0.05  # std of random model weights
        exact = np.asarray(x[:256], np.float64) @ np.asarray(w, np.float64)
        scale = float(np.abs(exact).max())
        def error(setting: str) -> float:
            with jax.default_matmul_precision(setting):
                out = np.asarray(jax.jit(lambda a, b: a[:256] @ b)(x, w), np.float64)
            return float(np.abs(out - exact).max()) / scale

        base = dict(case="dense", matmul=name, tokens=tokens, n_in=n_in, n_out=n_out)
        cells = precision_cells(run, base, f"dense {name}", lambda a, b: a @ b, (x, w), error)
        print(f"| {name} [{n_in}x{n_out}] | {cells}", flush=True)


def attention_precision(run: Run) -> None:
    """MiniLM's attention (12 heads, head_dim 32, packed rows, not causal) in float32 on the pipeline's
    rows, through the xla kernel (the one float32 reaches on gpu: cudnn and pallas_gpu refuse float32):
    ms per precision and max abs error against the float32 "highest" reference."""
    heads, head_dim = 12, 32
    print(f"\n## float32 xla attention at the pipeline's rows ({heads} heads, head_dim {head_dim}, packed; ms, "
          "max abs error against the float32 highest reference)\n")
    print("| batch x length | " + " | ".join(f"{n} ms | {n} error" for n, _ in PRECISIONS)
          + " | highest/tf32 | highest/default |")
    print("|---|" + "---|---|" * len(PRECISIONS) + "---|---|")
    for batch, length in run.pipeline_shapes:
        q, k, v = inputs(5, batch, length, heads, heads, head_dim, dtype=jnp.float32)
        seg = jnp.asarray(rows("packed", batch, length))
        try:
            ref = jax.jit(lambda q, k, v, s: device_reference(q, k, v, s, False))(q, k, v, seg)
        except Exception as error:  # noqa: BLE001
            run.fail(f"precision reference {batch}x{length}: {type(error).__name__}: {str(error)[:300]}")
            continue
        fn = kernel_fn(run, "xla", False, True)

        def error(setting: str) -> float:
            return float(compare(jax.jit(with_matmul_precision(fn, setting))(q, k, v, seg), ref, seg)[0])

        cells = precision_cells(run, dict(case="attention", batch=batch, length=length),
                                f"attention {batch}x{length}", fn, (q, k, v, seg), error)
        print(f"| {batch}x{length} | {cells}", flush=True)


def attention_precision_long(run: Run) -> None:
    """float32 xla attention at 1k tokens against float64, at each precision."""
    length = 1024 if not run.quick else 128
    q, k, v = inputs(3, 1, length, run.heads, run.heads, run.head_dim, dtype=jnp.float32)
    exact = reference_attention(*(np.asarray(x) for x in (q, k, v)))
    print(f"\n## float32 precision (xla, {length} tokens, max abs error against float64)\n")
    for label, setting in PRECISIONS:
        if run.out_of_time(f"precision {label}"):
            continue
        try:
            out = jax.jit(with_matmul_precision(lambda q, k, v: attention(q, k, v, impl="xla"), setting))(q, k, v)
            err = float(np.abs(np.asarray(out, np.float64) - exact).max())
            run.results["precision"].append(dict(case="attention float64", matmul_precision=label, setting=setting,
                                                 error=err, within_f32_bound=err <= F32_TOLERANCE))
            print(f"- {label} ({setting}): {err:.1e} ({'within' if err <= F32_TOLERANCE else 'outside'} the "
                  f"float32 bound {F32_TOLERANCE})")
        except Exception as error:  # noqa: BLE001
            if label == "tf32" and run.emulate:
                print(f"- {label} ({setting}): unsupported on {jax.default_backend()}")
                continue
            run.fail(f"precision {label}: {type(error).__name__}: {str(error)[:300]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes; runs on CPU too")
    parser.add_argument("--lengths", type=int, nargs="+",
                        default=[1024, 2048, 4096, 8192, 16384, 32768])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=130.0,
                        help="start no new case after this many seconds")
    parser.add_argument("--json", help="where to write the results (default $OUT/gpu_kernels.json)")
    parser.add_argument("--sections", nargs="+", choices=tuple(SECTIONS), default=list(SECTIONS),
                        help="run only these sections, in this order")
    parser.add_argument("--timing-causal", choices=("some", "all", "none", "only"), default="some",
                        help="causal timings: at 2k, 8k and 32k only (some), at every length, none, or only")
    args = parser.parse_args()
    if jax.default_backend() != "gpu" and not args.quick:
        print(f"needs a GPU backend (jax[cuda]); this machine runs jax on {jax.default_backend()} "
              f"(--quick runs small shapes here, Pallas interpreted)", file=sys.stderr)
        return 2
    run = Run(args)
    device = jax.devices()[0]
    print(f"# jax {jax.__version__} on {device.device_kind} (compute capability "
          f"{getattr(device, 'compute_capability', '-')}){' - emulated on CPU' if run.emulate else ''}")
    path = args.json or (os.path.join(os.environ["OUT"], "gpu_kernels.json") if os.environ.get("OUT")
                         else None)
    sections = [fn for name in args.sections for fn in SECTIONS[name]]
    run.results["sections"] = list(args.sections)
    for section in sections:
        try:
            section(run)
        except Exception as error:  # noqa: BLE001 - one broken section must not hide the others
            run.fail(f"{section.__name__}: {type(error).__name__}: {str(error)[:300]}")
        run.results["elapsed_s"] = round(time.perf_counter() - run.started, 1)
        if path:  # after every section, so an outside timeout still leaves what was measured
            with open(path, "w") as f:
                json.dump(run.results, f, indent=1, default=str)
    for skipped in run.results["skipped"]:
        print(f"skipped (budget): {skipped}")
    if path:
        print(f"wrote {path}")
    failed = run.results["failures"]
    print(f"\nparity and checks: {'FAILED (' + str(len(failed)) + ')' if failed else 'ok'}; "
          f"{run.results['elapsed_s']} s")
    return 1 if failed else 0


SECTIONS = {"checks": (check_choices, print_checks), "parity": (check_parity,), "timing": (timing,),
            "pipeline": (pipeline_shapes,), "precision": (precision,), "tiles": (pallas_tiles,)}


if __name__ == "__main__":
    sys.exit(main())
