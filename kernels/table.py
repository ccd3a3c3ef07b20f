"""The kernel table: every implementation by name, and per backend its flash kernel and the
order "auto" tries. A new kernel is one module plus a row here; no logic lives in this file.
"""
from __future__ import annotations

from kernels import blockwise, xla
from kernels.interface import Implementation

BACKENDS = ("cpu", "gpu", "tpu")

IMPLEMENTATIONS: dict[str, Implementation] = {
    impl.name: impl for impl in (xla.IMPLEMENTATION, blockwise.IMPLEMENTATION)
}

# "flash": the flash kernel written for each backend.
FLASH: dict[str, str] = {"cpu": "blockwise"}

# "auto": tried in this order; the first that supports the inputs runs (xla supports everything,
# so it is the last resort wherever it is listed last).
AUTO: dict[str, tuple[str, ...]] = {
    "cpu": ("xla", "blockwise"),
    "gpu": ("xla",),
    "tpu": ("xla",),
}

# "auto" skips xla when kv_len is above this (its [L, L] scores grow quadratically).
AUTO_XLA_MAX_KV_LEN: dict[str, int] = {"cpu": 1024}  # provisional; measurement follows
