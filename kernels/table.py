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
#   then blockwise: flash beat xla at every length measured (benchmarks/RESULTS.md, "GPU kernels").
AUTO: dict[str, tuple[str, ...]] = {
    "cpu": ("xla", "blockwise"),
    "gpu": ("cudnn", "pallas_gpu", "xla", "blockwise"),
    "tpu": ("splash_tpu", "pallas_tpu", "xla", "blockwise"),
}

# "auto" skips xla when kv_len is above this: its [L, L] scores grow quadratically. Memory guards, not speed
# crossovers. cpu: flash is as fast as xla from 512 tokens and faster above, and inside the whole model the
# kernels tie, so 1024 bounds memory only. gpu: flash is tried first at every length, so only inputs no flash
# kernel takes (float32 and the like) reach xla, whose temporaries grow ~4x per doubling. tpu: not measured;
# gpu's guard. The measurements: benchmarks/README.md, "Attention
# kernels", and benchmarks/RESULTS.md, "GPU kernels" and "auto's thresholds".
AUTO_XLA_MAX_KV_LEN: dict[str, int] = {"cpu": 1024, "gpu": 4096, "tpu": 4096}
