"""The kernel table: every implementation by name, and per backend its flash kernel and the
order "auto" tries. A new kernel is one module plus a row here; no logic lives in this file
(the rules that read it are in kernels/policy.py).
"""
from __future__ import annotations

from kernels import blockwise, cudnn, pallas_tpu, xla
from kernels.interface import Implementation

BACKENDS = ("cpu", "gpu", "tpu")

IMPLEMENTATIONS: dict[str, Implementation] = {
    impl.name: impl for impl in (xla.IMPLEMENTATION, blockwise.IMPLEMENTATION,
                                 pallas_tpu.IMPLEMENTATION, cudnn.IMPLEMENTATION)
}

# "flash": the flash kernel written for each backend.
FLASH: dict[str, str] = {"cpu": "blockwise", "gpu": "cudnn", "tpu": "pallas_tpu"}

# "auto": tried in this order; the first that runs on the backend and supports the inputs wins.
# blockwise supports everything, so every row ends in a kernel that always runs.
AUTO: dict[str, tuple[str, ...]] = {
    "cpu": ("xla", "blockwise"),
    "gpu": ("cudnn", "xla", "blockwise"),
    "tpu": ("pallas_tpu", "xla", "blockwise"),
}

# "auto" skips xla when kv_len is above this: its [L, L] scores grow quadratically.
# cpu: MEASURED (benchmarks/README.md, "attention"): PLACEHOLDER.
# gpu/tpu: not measured (no accelerator here); a memory guard, since xla's scores take
# batch*heads*L*L*4 bytes (805 MB per row at 4096 tokens and 12 heads).
AUTO_XLA_MAX_KV_LEN: dict[str, int] = {"cpu": 1024, "gpu": 4096, "tpu": 4096}
