"""How an --attention value becomes one implementation name: the whole selection policy.

- "native"       -> xla, on every backend.
- "flash"        -> the first of the backend's flash kernels (table.FLASH, in order) that supports
  the inputs (on gpu: cudnn, else pallas_gpu).
- an exact name  -> that implementation.
  These are explicit choices: honoured, or refused with KernelUnsupportedError naming the reason
  (each flash kernel's, for flash) and the alternatives. An explicit choice is never silently
  swapped for a kernel outside it (flash never becomes xla or blockwise on gpu).
- "auto"         -> the first implementation in table.AUTO[backend] that runs on the backend and
  supports the inputs (xla only up to table.AUTO_XLA_MAX_KV_LEN). Never raises for a known
  backend; logs each distinct choice once (logger "kernels.policy", level INFO).
Checks use only the shape info given: with none, only the backend is checked (the pipeline does
this before reading data); attention() resolves again with the real shapes at trace time.
This module must not compute attention.
"""
from __future__ import annotations

import logging
import math
import numbers

import jax
import numpy as np

from kernels import table
from kernels.interface import SHAPE_KEYS, KernelUnsupportedError, dtype_name, effective_window

POLICY_WORDS = ("auto", "native", "flash")
_BACKEND_ALIASES = {"cuda": "gpu", "rocm": "gpu"}
_NEEDS = {"tpu": "a TPU", "gpu": "a GPU", "cpu": "a CPU"}

log = logging.getLogger(__name__)
_logged_choices: set[str] = set()
GPU_INFO = "gpu"  # info's (device kind, (major, minor)) of the GPU the kernel will run on, where known


def available() -> dict[str, dict]:
    """Each implementation: the backends it runs on, its limits, whether it takes a local (sliding) window, an
    attention-logit soft cap and a relative position bias, and where it is the flash kernel."""
    return {name: {"backends": list(impl.backends), "limits": impl.limits, "local_window": impl.local_window,
                   "logit_soft_cap": impl.logit_soft_cap, "relative_position_bias": impl.relative_position_bias,
                   "flash_on": [b for b, names in table.FLASH.items() if name in names]}
            for name, impl in table.IMPLEMENTATIONS.items()}


def resolve(impl: str = "auto", backend: str | None = None, *, instead_of: str | None = None,
            gpu: tuple[str, tuple[int, int]] | None = None, **shape_info) -> str:
    """The implementation name `impl` means on `backend` (default: jax.default_backend()) for
    the given shape info (keys: interface.SHAPE_KEYS; all optional). Raises KernelUnsupportedError
    for an impossible explicit choice, whose suggestions leave out `instead_of` (a kernel the caller
    already runs, such as a shadow kernel's primary). `gpu`: (kind, (major, minor) compute capability) of the GPU the
    kernel will run on when that is another machine's (Dataflow workers'); with `backend` left out, this process's GPU
    is read instead; kernels whose min_gpu_capability it lacks are refused, and auto passes them by."""
    info = _normal_shape_info(shape_info)
    backend = _with_gpu(backend, info, gpu)
    if impl == "auto":
        return _resolve_auto(backend, info)
    if impl == "native":
        name = "xla"
    elif impl == "flash":
        return _resolve_flash(backend, info, instead_of)
    elif impl in table.IMPLEMENTATIONS:
        name = impl
    else:
        raise KernelUnsupportedError(
            f"--attention={impl} is not a known attention implementation; use one of "
            f"{', '.join(POLICY_WORDS + tuple(table.IMPLEMENTATIONS))}")
    ok, reason = _supported(name, backend, info)
    if not ok:
        chosen = impl if impl == name else f"{impl} ({name} on {backend})"
        raise KernelUnsupportedError(
            f"--attention={chosen} cannot run on {backend}: {reason}; "
            f"use {_alternatives(name, backend, info, instead_of)}")
    return name


def _resolve_flash(backend: str, info: dict, instead_of: str | None = None) -> str:
    """The first of table.FLASH[backend] that supports the inputs; refused with every one's reason."""
    names = table.FLASH.get(backend, ())
    if not names:
        raise KernelUnsupportedError(
            f"--attention=flash cannot run on {backend}: no flash kernel is registered for "
            f"{backend}; use --attention=native or auto")
    reasons = []
    for name in names:
        ok, reason = _supported(name, backend, info)
        if ok:
            return name
        reasons.append(reason)
    why = reasons[0] if len(names) == 1 else "; ".join(f"{n}: {r}" for n, r in zip(names, reasons))
    raise KernelUnsupportedError(
        f"--attention=flash ({' or '.join(names)} on {backend}) cannot run on {backend}: {why}; "
        f"use {_alternatives(names[0], backend, info, instead_of)}")


def _flash_for(backend: str, info: dict) -> str | None:
    """The kernel flash runs for these inputs on `backend`, or None where it would be refused."""
    return next((n for n in table.FLASH.get(backend, ()) if _supported(n, backend, info)[0]), None)


def _resolve_auto(backend: str, info: dict) -> str:
    skipped = []
    for name in table.AUTO[backend]:
        ok, reason = _supported(name, backend, info)
        limit = table.AUTO_XLA_MAX_KV_LEN.get(backend)
        if ok and name == "xla" and limit is not None and info.get("kv_len", 0) > limit:
            ok, reason = False, f"kv_len {info['kv_len']} > {limit} (auto's xla limit on {backend})"
        if ok:
            _log_once(backend, name, info, skipped)
            return name
        skipped.append(f"{name}: {reason}")
    raise KernelUnsupportedError(  # unreachable while blockwise, which takes every input, ends every AUTO row
        f"--attention=auto found no kernel for these inputs on {backend} ({'; '.join(skipped)})")


def _supported(name: str, backend: str, info: dict) -> tuple[bool, str]:
    impl = table.IMPLEMENTATIONS[name]
    if backend not in impl.backends:
        needs = _NEEDS[impl.backends[0]] if len(impl.backends) == 1 else " or ".join(impl.backends)
        return False, f"it needs {needs}"
    gpu = info.get(GPU_INFO)
    if backend == "gpu" and impl.min_gpu_capability and gpu and gpu[1] < impl.min_gpu_capability:
        need = ".".join(map(str, impl.min_gpu_capability))
        return False, (f"it needs an Ampere or newer GPU (compute capability {need}), but the GPU it would run on is "
                       f"{gpu[0]} (compute capability {gpu[1][0]}.{gpu[1][1]})")
    if info.get("window") and not impl.local_window:
        window = info["window"]
        # a causal window counts the query itself among its `window` keys; an encoder's sees window - 1 keys on each
        # side of it (ModernBERT-base's local_attention 128: 64 each way), which is what its model card says
        span = f"{window}" if info.get("causal", True) else f"{window - 1} positions each way"
        rows = (f" in rows of {info['q_len']} tokens (rows of at most {window} tokens would not need it)"
                if info.get("q_len") else "")
        return False, f"it has no local (sliding-window) attention, which this model's window of {span} needs{rows}"
    if info.get("soft_cap") and not impl.logit_soft_cap:
        return False, (f"it has no attention-logit soft-capping (scores = tanh(scores / cap) * cap), which this "
                       f"model's cap of {info['soft_cap']:g} needs (Gemma 2's attn_logit_softcapping)")
    if info.get("relative_bias") and not impl.relative_position_bias:
        return False, ("it has no relative position bias (a learned score per head and key-query offset added to the "
                       "scores), which this model's attention needs (MPNet's and T5's relative_attention_bias)")
    return impl.is_supported(**info)


def local_gpu_capability() -> tuple[str, tuple[int, int]] | None:
    """(device kind, (major, minor)) of this process's first GPU, or None without a local GPU (a launch for remote
    GPU workers: pipeline/dataflow_checks.py checks their kind) or where the device does not say."""
    try:
        device = jax.local_devices(backend="gpu")[0]
    except RuntimeError:
        return None
    capability = getattr(device, "compute_capability", None)
    try:
        major, minor = (int(part) for part in str(capability).split(".")[:2])
    except ValueError:
        return None
    return device.device_kind, (major, minor)


def _with_gpu(backend: str | None, info: dict, gpu: tuple[str, tuple[int, int]] | None) -> str:
    """The normalised backend; on a GPU backend, the kind and capability of the GPU the kernel runs on go into info
    under GPU_INFO: `gpu` when the caller names it (remote workers'), else this process's own when the backend is
    left out (the kernel runs here, as at load and at trace time). A named backend without `gpu` may be another
    machine's whose GPU is not known, so nothing is added."""
    here = backend is None
    backend = _normal_backend(backend)
    if backend == "gpu":
        gpu = gpu or (local_gpu_capability() if here else None)
        if gpu is not None:
            info[GPU_INFO] = gpu
    return backend


def _alternatives(name: str, backend: str, info: dict, instead_of: str | None = None) -> str:
    options = []
    flash = _flash_for(backend, info)
    if flash is not None and flash not in (name, instead_of):
        options.append(f"--attention=flash ({flash} on {backend})")
    if "xla" not in (name, instead_of):
        options.append("native" if options else "--attention=native")
    if name in table.FLASH.get(backend, ()) and instead_of is None:
        options.append("auto (picks a kernel that supports these inputs)")
    if not options:  # every usual suggestion is the kernel the caller already runs: another that takes the inputs
        options = [f"--attention={n}" for n in _others_supported((name, instead_of), backend, info)[:1]]
    return " or ".join(options or [f"--attention={instead_of}"])


def other_choice(kernel: str, backend: str | None = None, *, gpu: tuple[str, tuple[int, int]] | None = None,
                 **shape_info) -> str:
    """A choice of --attention (native, flash or an implementation's name) that runs these inputs on `backend` with
    another kernel than `kernel` (what a shadow of `kernel` could use): native, else flash, else the first
    implementation that supports them (xla supports everything, so only xla itself falls through to native); `gpu`
    as resolve's."""
    if kernel not in table.IMPLEMENTATIONS:
        raise KernelUnsupportedError(f"{kernel!r} is not an attention implementation; other_choice takes one of "
                                     f"{', '.join(table.IMPLEMENTATIONS)}")
    info = _normal_shape_info(shape_info)
    backend = _with_gpu(backend, info, gpu)
    if kernel != "xla":
        return "native"
    if _flash_for(backend, info) not in (None, kernel):
        return "flash"
    return next(iter(_others_supported((kernel,), backend, info)), "native")


def _others_supported(exclude: tuple, backend: str, info: dict) -> list[str]:
    """The implementations other than `exclude` that support these inputs on `backend`, in table order."""
    return [n for n in table.IMPLEMENTATIONS if n not in exclude and _supported(n, backend, info)[0]]


def _normal_backend(backend: str | None) -> str:
    backend = (backend or jax.default_backend()).lower()
    backend = _BACKEND_ALIASES.get(backend, backend)
    if backend not in table.BACKENDS:
        raise KernelUnsupportedError(
            f"attention backend {backend!r} is unknown; docscore has kernels for "
            f"{', '.join(table.BACKENDS)} (set JAX_PLATFORMS to one of them)")
    return backend


def _normal_shape_info(shape_info: dict) -> dict:
    unknown = set(shape_info) - set(SHAPE_KEYS)
    if unknown:
        raise TypeError(f"resolve() got unknown shape info {sorted(unknown)}; known: {SHAPE_KEYS}")
    info = {k: v for k, v in shape_info.items() if v is not None}
    if "dtype" in info:
        try:
            info["dtype"] = dtype_name(info["dtype"])
        except TypeError:
            raise TypeError(f"resolve() got dtype {info['dtype']!r}, which is not a dtype; give one such as "
                            "'float32', 'bfloat16' or jnp.bfloat16") from None
    cap = info.get("soft_cap")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, numbers.Real) or not 0 < cap < math.inf):
        raise TypeError(f"resolve() got soft_cap {cap!r}; give a positive, finite number (or None: no cap)")
    if not isinstance(info.get("relative_bias", False), (bool, np.bool_)):
        raise TypeError(f"resolve() got relative_bias of type {type(info['relative_bias']).__name__}; give True or False "
                        "(whether the call adds a relative position bias), not the bias itself")
    if "packed" not in info and "has_segments" in info:  # unstated: segment ids may be packed
        info["packed"] = bool(info["has_segments"])
    if effective_window(info.get("window"), info.get("q_len"), info.get("kv_len")) is None:
        info.pop("window", None)
    return info


def _log_once(backend: str, name: str, info: dict, skipped: list[str]) -> None:
    """Log an auto choice the first time it is made (keyed by backend, choice and the kernels
    skipped, so lengths varying from batch to batch do not repeat it)."""
    key = f"{backend}:{name}:{','.join(s.split(':')[0] for s in skipped)}"
    if key not in _logged_choices:
        _logged_choices.add(key)
        why = f" (skipped {'; '.join(skipped)})" if skipped else ""
        log.info(f"--attention=auto chose {name} on {backend}{why}")
