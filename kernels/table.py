"""The kernel table: every implementation by name, and per backend its flash kernel and the
order "auto" tries. A new kernel is one module plus a row here; no logic lives in this file
(the rules that read it are in kernels/policy.py).
"""
from __future__ import annotations

from kernels import blockwise, cudnn, pallas_gpu, pallas_tpu, xla
from kernels.interface import Implementation

BACKENDS = ("cpu", "gpu", "tpu")

IMPLEMENTATIONS: dict[str, Implementation] = {
    impl.name: impl for impl in (xla.IMPLEMENTATION, blockwise.IMPLEMENTATION,
                                 pallas_tpu.IMPLEMENTATION, cudnn.IMPLEMENTATION,
                                 pallas_gpu.IMPLEMENTATION)
}

# "flash": the flash kernels written for each backend, in order of preference; the first that
# supports the inputs runs. On gpu, cudnn (fastest where it applies: no segments, or one segment
# per row then padding) before pallas_gpu (packed segments, masked inside the kernel).
FLASH: dict[str, tuple[str, ...]] = {
    "cpu": ("blockwise",),
    "gpu": ("cudnn", "pallas_gpu"),
    "tpu": ("pallas_tpu",),
}

# "auto": tried in this order; the first that runs on the backend and supports the inputs wins.
# blockwise supports everything, so every row ends in a kernel that always runs.
AUTO: dict[str, tuple[str, ...]] = {
    "cpu": ("xla", "blockwise"),
    "gpu": ("cudnn", "pallas_gpu", "xla", "blockwise"),
    "tpu": ("pallas_tpu", "xla", "blockwise"),
}

# "auto" skips xla when kv_len is above this: its [L, L] scores grow quadratically.
# cpu: kernel time alone puts the crossover at or below 512, so 1024 is a conservative memory guard,
#   not a measured speed optimum. benchmarks/README.md ("Attention kernels"): blockwise/xla time 0.50
#   at 512 and 0.70 at 2048 (batch 1, 12 heads, head_dim 32, float32, 2-core box). Rerun here
#   2026-12-04 (attention_memory.py --batches 1 8 --lengths 256 512 1024 2048; load 1.1-4.6 from
#   other work, so noisy): 1.23 / 0.66 / 0.58 / 0.38 at batch 1, 1.02 / 0.98 / 0.28 / 0.34 at
#   batch 8. Inside the whole model flash/native averaged 1.00 in bfloat16 over the pipeline's row
#   shapes (benchmarks/kernel_in_model.py), so a lower limit would change little; left at 1024.
# gpu: cudnn or pallas_gpu come before xla for every supported input, so this only bounds xla for
#   float32 (and other inputs no flash kernel takes). Measured on an H200 (2026-12-04, the shared
#   GPU notes outside this repository; batch 1, 12 heads, head_dim 64, bf16, before this change): xla 0.21 / 0.42 / 1.26 / 4.24 / 18.3 ms at
#   1k / 2k / 4k / 8k / 16k tokens, cudnn 0.27 / 0.27 / 1.03 / 1.17 ms to 8k; xla's float32 scores
#   take batch*heads*L*L*4 bytes (805 MB per row at 4096 tokens and 12 heads).
#   4096 is a memory guard, not that crossover (~2k). benchmarks/gpu_kernels.py measures cudnn,
#   pallas_gpu, xla and blockwise per length; pallas_gpu's own speed is not measured yet.
# tpu: not measured (no TPU here); the same memory guard as gpu.
AUTO_XLA_MAX_KV_LEN: dict[str, int] = {"cpu": 1024, "gpu": 4096, "tpu": 4096}
