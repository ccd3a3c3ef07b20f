"""The kernel table: every implementation by name, and per backend its flash kernel and the
order "auto" tries. A new kernel is one module plus a row here; no logic lives in this file
(the rules that read it are in kernels/policy.py).
"""
from __future__ import annotations

from kernels import blockwise, cudnn, pallas_gpu, pallas_tpu, splash_tpu, xla
from kernels.interface import Implementation

BACKENDS = ("cpu", "gpu", "tpu")

IMPLEMENTATIONS: dict[str, Implementation] = {
    impl.name: impl for impl in (xla.IMPLEMENTATION, blockwise.IMPLEMENTATION,
                                 pallas_tpu.IMPLEMENTATION, splash_tpu.IMPLEMENTATION,
                                 cudnn.IMPLEMENTATION, pallas_gpu.IMPLEMENTATION)
}

# "flash": the flash kernels written for each backend, in order of preference; the first that
# supports the inputs runs. On gpu, cudnn (fastest where it applies: no segments, or one segment
# per row then padding) before pallas_gpu (packed segments, masked inside the kernel). On tpu,
# splash_tpu (grouped-query without repeating kv heads, segment ids, causal blocks skipped) before the
# legacy pallas_tpu, decided on capability since no TPU has timed them (benchmarks/RESULTS.md, "TPU
# flash: splash attention"); pallas_tpu stays second and as an explicit name (today it refuses whatever
# splash_tpu refuses: a dtype other than float32 or bfloat16).
FLASH: dict[str, tuple[str, ...]] = {
    "cpu": ("blockwise",),
    "gpu": ("cudnn", "pallas_gpu"),
    "tpu": ("splash_tpu", "pallas_tpu"),
}

# "auto": tried in this order; the first that runs on the backend and supports the inputs wins.
# blockwise supports everything, so every row ends in a kernel that always runs.
# gpu: the flash kernels first at every length (cudnn, then pallas_gpu; no length limit), xla only
#   as the fallback for inputs both refuse (float32, head_dim > 128, causal with q_len != kv_len),
#   then blockwise. Measured on an H200: flash beat xla at every length from 1k (see
#   AUTO_XLA_MAX_KV_LEN below).
AUTO: dict[str, tuple[str, ...]] = {
    "cpu": ("xla", "blockwise"),
    "gpu": ("cudnn", "pallas_gpu", "xla", "blockwise"),
    "tpu": ("splash_tpu", "pallas_tpu", "xla", "blockwise"),
}

# "auto" skips xla when kv_len is above this: its [L, L] scores grow quadratically.
# cpu: kernel time alone puts the crossover at or below 512, so 1024 is a conservative memory guard,
#   not a measured speed optimum. benchmarks/README.md ("Attention kernels"): blockwise/xla time 0.50
#   at 512 and 0.70 at 2048 (batch 1, 12 heads, head_dim 32, float32, 2-core box). Rerun here
#   2026-12-04 (attention_memory.py --batches 1 8 --lengths 256 512 1024 2048; load 1.1-4.6 from
#   other work, so noisy): 1.23 / 0.66 / 0.58 / 0.38 at batch 1, 1.02 / 0.98 / 0.28 / 0.34 at
#   batch 8. Inside the whole model flash/native averaged 1.00 in bfloat16 over the pipeline's row
#   shapes (benchmarks/kernel_in_model.py), so a lower limit would change little; left at 1024.
# gpu: only the fallback above reaches xla (flash is tried first at every length), so this bounds
#   xla for inputs no flash kernel takes (float32 and the like); it is a memory guard, not a speed
#   crossover. Measured on an H200 (2026-12-04, benchmarks/RESULTS.md "GPU kernels";
#   benchmarks/gpu_kernels.py; batch 1, 12 heads, head_dim 64, bf16, not causal, median of 5):
#   xla 0.39 / 0.37 / 1.27 / 4.31 ms at 1k / 2k / 4k / 8k tokens, cudnn (padded rows, lengths)
#   0.24 / 0.29 / 0.48 / 0.71, pallas_gpu (packed rows) 0.24 / 0.26 / 0.51 ms to 4k: flash is
#   1.6x xla at 1k, 1.3-1.5x at 2k, 2.5-2.7x at 4k, 6.1x at 8k. xla's compiled temp memory grows
#   ~4x per 2x length (80 MiB at 1k, 1.1 GiB at 4k, 4.6 GiB at 8k for one row), cudnn's and
#   pallas_gpu's stay under 10 KB. Not measured yet: 16k/32k and causal timings, blockwise's time
#   on gpu (so no measured xla/blockwise crossover for float32), float32 xla; left at 4096.
# tpu: not measured (no TPU here); the same memory guard as gpu.
AUTO_XLA_MAX_KV_LEN: dict[str, int] = {"cpu": 1024, "gpu": 4096, "tpu": 4096}
