"""Process-start tuning docscore applies itself: glibc malloc settings (mallopt), XLA CPU flags chosen
per kernel (measured: benchmarks/PERF_NOTES.md, benchmarks/pipeline_tuning.py) and JAX's persistent
compilation cache. Must not import jax at module import, nor override what the user set explicitly.

XLA flags only take effect for a JAX backend created after apply_cpu_tuning(), so the launcher calls
it first thing and workers call it before loading a model; environment variables are inherited by
worker processes, so multi-process runners get the same flags.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import logging
import os
import platform
import posixpath
import re
import shlex
import uuid
import warnings
import zlib

log = logging.getLogger(__name__)

# DOCSCORE_CPU_TUNING=0 turns the malloc and XLA-flag tuning off (for measuring it on and off).
ENV_SWITCH = "DOCSCORE_CPU_TUNING"
COMPILATION_CACHE_SUBDIR = "jax-compilation-cache"
MIN_COMPILE_TIME_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"  # jax's own variable for that setting

# mallopt(3) parameters and the values applied: keep big XLA temporaries in the heap instead of mapping
# and unmapping them on every call (system time, benchmarks/PERF_NOTES.md), and, where the model runs on this
# CPU, one arena so that allocations of XLA's worker threads get the same treatment (a thread arena maps
# anything larger than its 64 MiB heap whatever the threshold says). One arena serialises every thread's
# malloc: the tokenizer's batch encode on its own threads ran several times slower under it, so with one arena
# the tokenizer encodes on the calling thread (TOKENIZERS_PARALLELISM), and a host that drives an accelerator
# keeps glibc's arenas (benchmarks/PERF_NOTES.md, "One malloc arena").
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8
MALLOPT_VALUES = {
    "M_MMAP_THRESHOLD": (M_MMAP_THRESHOLD, 1 << 30, "MALLOC_MMAP_THRESHOLD_"),
    "M_TRIM_THRESHOLD": (M_TRIM_THRESHOLD, (1 << 31) - 1, "MALLOC_TRIM_THRESHOLD_"),
    "M_TOP_PAD": (M_TOP_PAD, 256 << 20, "MALLOC_TOP_PAD_"),
    "M_ARENA_MAX": (M_ARENA_MAX, 1, "MALLOC_ARENA_MAX"),
}

# XLA CPU flags, for a CPU where YNNPACK's dots pay off (ynn_dots_pay_off): the same for every attention kernel,
# since at the pipeline's <= 256-token rows the dense layers dominate (benchmarks/PERF_NOTES.md, "process_setup.py";
# on and off end to end: RESULTS.md).
YNN_INDIVIDUAL_DOT = "--xla_cpu_experimental_ynn_fusion_type=individual_dot"
# Where YNNPACK's dots do not pay off: an empty list of YNN fusion types, so every dot stays in XLA's own
# code (jaxlib 0.10.2 sends dots to YNNPACK even without a flag), which is faster there (benchmarks/README.md,
# "Dots in or out of YNNPACK, by CPU").
YNN_OFF = "--xla_cpu_experimental_ynn_fusion_type="

ONE_ARENA = "M_ARENA_MAX"
TOKENIZERS_PARALLELISM = "TOKENIZERS_PARALLELISM"  # the tokenizers library's switch for its own threads
ACCELERATOR_PLATFORMS = ("cuda", "rocm", "tpu", "gpu")  # JAX_PLATFORMS names of accelerator backends

# CPU feature flags (as Linux lists them in /proc/cpuinfo) of instructions that multiply bfloat16 natively:
# x86 AVX512-BF16 and AMX-BF16, Arm FEAT_BF16. Without one, bfloat16 matmuls are emulated.
NATIVE_BFLOAT16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


@dataclasses.dataclass(frozen=True)
class CpuTuning:
    """What to apply. cache_dir: the docscore cache dir (the compilation cache goes under it unless
    JAX_COMPILATION_CACHE_DIR is set)."""

    dtype: str = "float32"  # the --dtype value: bfloat16 gets other XLA flags on a CPU without bfloat16 instructions
    cache_dir: str | None = None
    malloc: bool = True
    xla_flags: bool = True
    compilation_cache: bool = True


@dataclasses.dataclass
class TuningReport:
    """What apply_cpu_tuning did and left out, for a caller that checks it (the tests do; the command does not print it)."""

    mallopt: dict[str, int] = dataclasses.field(default_factory=dict)
    env_set: dict[str, str] = dataclasses.field(default_factory=dict)  # environment variables this process set
    xla_flags_added: list[str] = dataclasses.field(default_factory=list)
    compilation_cache_dir: str | None = None
    skipped: list[str] = dataclasses.field(default_factory=list)


def tuning_enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


def apply_cpu_tuning(tuning: CpuTuning | None = None) -> TuningReport:
    """Apply the tuning to this process (idempotent). Malloc and XLA flags only when
    DOCSCORE_CPU_TUNING is not 0; the compilation cache unless tuning.compilation_cache is False."""
    tuning = tuning or CpuTuning()
    report = TuningReport()
    if tuning_enabled():
        if tuning.malloc:
            names = tuple(MALLOPT_VALUES)
            accelerator = accelerator_expected()
            if accelerator:
                names = tuple(n for n in names if n != ONE_ARENA)
                report.skipped.append(f"{ONE_ARENA}: JAX will start on an accelerator ({accelerator}): the host's "
                                      "threads keep glibc's arenas")
            report.mallopt, skipped = apply_mallopt(names)
            report.skipped += skipped
            if ONE_ARENA in report.mallopt and TOKENIZERS_PARALLELISM not in os.environ:
                os.environ[TOKENIZERS_PARALLELISM] = report.env_set[TOKENIZERS_PARALLELISM] = "false"
        if tuning.xla_flags:
            report.xla_flags_added = add_xla_flags(xla_flags_for(tuning.dtype, cpu_features()))
    else:
        report.skipped.append(f"{ENV_SWITCH}=0: malloc and XLA flag tuning off")
    if tuning.compilation_cache:
        report.compilation_cache_dir = enable_compilation_cache(tuning.cache_dir)
    log.info("cpu tuning: %s", report)
    return report


def accelerator_expected() -> str | None:
    """Why JAX will start on an accelerator, judged before it starts (an arena limit must come before the
    threads it is for), or None for a CPU: JAX_PLATFORMS's first entry when it is set; else a PJRT plugin
    installed where JAX looks for one (jax[cuda] installs one) or libtpu. A plugin installed on a machine
    without its device misjudges a CPU run: it then keeps glibc's arenas, which slow its model calls a little
    (benchmarks/PERF_NOTES.md, "One malloc arena")."""
    platforms = os.environ.get("JAX_PLATFORMS", "").strip()
    if platforms:
        first = platforms.split(",")[0].strip().lower()
        return f"JAX_PLATFORMS={platforms}" if first in ACCELERATOR_PLATFORMS else None
    return installed_accelerator_runtime()


@functools.lru_cache(maxsize=1)
def installed_accelerator_runtime() -> str | None:
    """The PJRT plugins installed where JAX looks for them (the jax_plugins namespace package and entry
    points), or libtpu; None when there are none."""
    import importlib.metadata
    import importlib.util
    import pkgutil

    namespace = importlib.util.find_spec("jax_plugins")
    plugins = [m.name for m in pkgutil.iter_modules(namespace.submodule_search_locations)] if namespace else []
    plugins += [e.name for e in importlib.metadata.entry_points(group="jax_plugins")]
    if plugins:
        return f"PJRT plugin {', '.join(sorted(set(plugins)))} installed"
    if importlib.util.find_spec("libtpu") is not None:
        return "libtpu installed"
    return None


def accelerator_host_env() -> dict[str, str]:
    """Environment that gives a process an accelerator host's malloc tuning on any machine (a benchmark of a GPU
    host's host work run on a CPU): glibc's own arena limit (8 per core), set as a user would, so that
    apply_cpu_tuning leaves the arenas and the tokenizer's threads as they are."""
    return {"MALLOC_ARENA_MAX": str(8 * (os.cpu_count() or 1))}


def apply_mallopt(names: tuple[str, ...] = tuple(MALLOPT_VALUES)) -> tuple[dict[str, int], list[str]]:
    """Set MALLOPT_VALUES[names] through glibc's mallopt; a parameter the user set through its MALLOC_*
    environment variable is left alone. Returns (applied {name: value}, skipped reasons)."""
    applied: dict[str, int] = {}
    skipped: list[str] = []
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return applied, [f"mallopt: not glibc ({platform.system()} {platform.libc_ver()[0] or '?'})"]
    libc = ctypes.CDLL(None)
    for name in names:
        param, value, env = MALLOPT_VALUES[name]
        if env in os.environ:
            skipped.append(f"{name}: {env} is set")
            continue
        if libc.mallopt(ctypes.c_int(param), ctypes.c_int(value)) == 1:
            applied[name] = value
        else:
            skipped.append(f"{name}: glibc refused {value}")
    return applied, skipped


def xla_flags_for(dtype: str = "float32", features: frozenset[str] | None = None) -> tuple[str, ...]:
    """The XLA CPU flags chosen for `dtype` on a CPU with these feature flags (cpu_features(); None: unknown),
    whatever the attention kernel."""
    return (YNN_INDIVIDUAL_DOT,) if ynn_dots_pay_off(dtype, features) else (YNN_OFF,)


def ynn_dots_pay_off(dtype: str, features: frozenset[str] | None) -> bool:
    """Whether to send dots to YNNPACK, by what was measured (see YNN_OFF): on x86 it needs AVX-512 in float32
    and bfloat16 instructions in bfloat16 (an AVX2-only CPU was faster without it in both). CPUs not measured
    (Arm, or no feature list) keep YNNPACK, jaxlib's own choice."""
    if features is None or "avx2" not in features:  # not x86, or unknown
        return True
    if dtype == "bfloat16":
        return has_native_bfloat16(features) is True
    return "avx512f" in features


def cpu_features(cpuinfo_path: str = "/proc/cpuinfo") -> frozenset[str] | None:
    """This CPU's feature flags: the "flags" line of /proc/cpuinfo on x86, "Features" on Arm; None where
    there is no such list (not Linux)."""
    try:
        with open(cpuinfo_path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return None


def has_native_bfloat16(features: frozenset[str] | None) -> bool | None:
    """Whether a CPU with these feature flags multiplies bfloat16 natively; None when unknown."""
    return None if features is None else bool(features & NATIVE_BFLOAT16_FLAGS)


def describe_cpu_choice(features: frozenset[str] | None) -> str:
    """One line for benchmark reports: the CPU facts that decide the XLA flags, and the flags chosen."""
    if features is None:
        return "CPU feature list unknown (no /proc/cpuinfo): jaxlib's default flags"
    native = has_native_bfloat16(features)
    return (f"AVX-512 {'yes' if 'avx512f' in features else 'no'}, bfloat16 instructions {'yes' if native else 'no'}; "
            f"docscore's XLA flags: float32 {' '.join(xla_flags_for('float32', features)) or '-'}, "
            f"bfloat16 {' '.join(xla_flags_for('bfloat16', features)) or '-'}")


def add_xla_flags(flags: tuple[str, ...] | list[str]) -> list[str]:
    """Append flags to $XLA_FLAGS unless the flag's name is already there (the user's value wins; one with an
    unbalanced quote gets them before it, where XLA reads them). Returns the flags added."""
    current = os.environ.get("XLA_FLAGS", "")
    unbalanced = False
    try:
        names = shlex.split(current)
    except ValueError:  # an unbalanced quote: XLA reads the value all the same, so docscore must not stop on it
        names, unbalanced = current.split(), True
    present = {f.split("=", 1)[0] for f in names}
    added = [f for f in flags if f.split("=", 1)[0] not in present]
    if added:  # the user's value kept as written, ours after it; XLA reads an unbalanced quote's value to the end of
        # XLA_FLAGS, which would take ours into it (never applied, and the user's --xla_dump_to path changed): before it
        user = [current] if current.strip() else []
        os.environ["XLA_FLAGS"] = " ".join(added + user if unbalanced else user + added)
    return added


_exported_cache_dir: str | None = None  # what enable_compilation_cache exported: this process's, not the user's


def _users_cache_dir() -> str | None:
    """JAX_COMPILATION_CACHE_DIR when the user set it (not a value this process exported for an earlier run)."""
    env = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    return env if env and env != _exported_cache_dir else None


def compilation_cache_dir(cache_dir: str | None) -> str:
    """$JAX_COMPILATION_CACHE_DIR when the user set it, else <docscore cache dir>/jax-compilation-cache (a
    value this process exported for an earlier run does not hold a later run with another --cache_dir)."""
    env = _users_cache_dir()
    if env:
        return env
    from models.model_dir import default_cache_dir

    return posixpath.join(cache_dir or default_cache_dir(), COMPILATION_CACHE_SUBDIR)


def compilation_cache_setting(cache_dir: str | None) -> str:
    """Which setting chose compilation_cache_dir(cache_dir), for messages."""
    env = _users_cache_dir()
    if env:
        return f"JAX_COMPILATION_CACHE_DIR={env}"
    if cache_dir:
        return f"--cache_dir {cache_dir}"
    from models.model_dir import CACHE_DIR_ENV, default_cache_dir

    if os.environ.get(CACHE_DIR_ENV):
        return f"--cache_dir (default {CACHE_DIR_ENV}={default_cache_dir()})"
    return f"--cache_dir (default {default_cache_dir()})"


def check_compilation_cache(path: str) -> str | None:
    """Whether `path` (local or gs://) can take the programs this run compiles: None once the directory is made
    and a probe file written and removed there; why not, for a directory that is there but cannot be written (a
    cache baked into a read-only image or mount, a bucket this account only reads, a full disk): its programs still
    load, and JAX warns, per program, that it could not save one. OSError when it is neither."""
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(path)
    except Exception as e:  # an unknown protocol, a malformed URL
        raise OSError(f"{type(e).__name__}: {e}") from e
    try:
        fs.makedirs(root, exist_ok=True)
        probe = posixpath.join(root, f".docscore-probe-{uuid.uuid4().hex[:12]}")
        fs.pipe_file(probe, b"")
        fs.rm_file(probe)
        return None
    except Exception as e:  # gcsfs raises its own HttpError for what has no OSError of its own
        try:  # a directory there to read: its programs still load
            readable = fs.isdir(root) and isinstance(fs.ls(root), list)
        except Exception:  # any store's error (gcsfs has its own): not readable, so the probe's error stands
            readable = False
        if readable:
            return f"{type(e).__name__}: {e}"
        raise e if isinstance(e, OSError) else OSError(f"{type(e).__name__}: {e}") from e


def read_only_cache_notice(cache_dir: str | None, path: str, why: str) -> str:
    """The launcher's note for a compilation cache check_compilation_cache could read but not write (`why`)."""
    return (f"{compilation_cache_setting(cache_dir)}: the compilation cache {path} cannot be written here ({why}): "
            "the programs it holds load, the ones this run compiles are not saved (each compile is counted cold in "
            "the summary)")


def enable_compilation_cache(cache_dir: str | None) -> str:
    """Turn JAX's persistent compilation cache on (a second run loads its programs instead of
    compiling them) for every program, however fast it compiled: JAX by default skips programs that
    compile in under a second, as several of a run's small packed-row programs do, and loading beats
    compiling even for those (benchmarks/PERF_NOTES.md, "process_setup.py"). A
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS the user exported wins. Exported to the environment too, so
    worker processes share it."""
    import jax

    global _exported_cache_dir
    path = compilation_cache_dir(cache_dir)
    if "://" not in path:
        os.makedirs(path, exist_ok=True)
    if os.environ.get("JAX_COMPILATION_CACHE_DIR") != path:
        os.environ["JAX_COMPILATION_CACHE_DIR"] = _exported_cache_dir = path
    os.environ.setdefault(MIN_COMPILE_TIME_ENV, "0")
    if jax.config.jax_compilation_cache_dir not in (None, path):  # JAX opens its cache once; a later run moves it
        from jax.experimental.compilation_cache import compilation_cache

        compilation_cache.reset_cache()
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(os.environ[MIN_COMPILE_TIME_ENV]))
    watch_unreadable_cache_entries()
    return path


# How JAX warns when an entry of its persistent cache cannot be read (jax's compiler.py); it then compiles the
# program, but never writes over an entry that exists, so an entry cut short (a full disk, a killed write) would
# make every later run compile that program cold.
UNREADABLE_ENTRY_WARNING = "Error reading persistent compilation cache entry for '"
_watching_cache_reads = False


def watch_unreadable_cache_entries() -> None:
    """On JAX's warning about an unreadable entry of a local compilation cache, remove that program's entries that
    cannot be decompressed (unreadable_cache_entries) before JAX compiles it, so this run writes them again; the
    warning says so. Installed once per process; every such warning is shown (not once per place)."""
    global _watching_cache_reads
    if _watching_cache_reads:
        return
    _watching_cache_reads = True
    warnings.filterwarnings("always", message=re.escape(UNREADABLE_ENTRY_WARNING))
    shown = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        text = str(message)
        if text.startswith(UNREADABLE_ENTRY_WARNING):
            import jax

            directory = jax.config.jax_compilation_cache_dir
            program = text[len(UNREADABLE_ENTRY_WARNING):].split("'", 1)[0]
            removed = []
            if directory and "://" not in directory:
                # those that do not decompress; if every one does, yet one does not load (XLA cannot parse it), it
                # cannot be told from the program's others, so all of them go, and this run and the next write them again
                unreadable = (unreadable_cache_entries(directory, program)
                              or unreadable_cache_entries(directory, program, whole_program=True))
                removed = removed_cache_entries(unreadable)
            if removed:
                message = (f"{text} (docscore removed the unreadable {', '.join(os.path.basename(p) for p in removed)} "
                           "from the cache, so this run writes the program again)")
        shown(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning


def unreadable_cache_entries(directory: str, program: str, whole_program: bool = False) -> list[str]:
    """The entries of `program` (a program name, or one entry's key) in the local compilation cache `directory` that
    neither zstandard nor zlib can decompress, the two codecs JAX writes them with (every entry of it with
    `whole_program`)."""
    import glob

    try:
        import zstandard
    except ImportError:
        zstandard = None
    found = []
    for path in glob.glob(os.path.join(glob.escape(directory), glob.escape(program) + "-cache")) + glob.glob(
            os.path.join(glob.escape(directory), glob.escape(program) + "-*-cache")):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        if whole_program or not _decompresses(data, zstandard):
            found.append(path)
    return found


def removed_cache_entries(paths: list[str]) -> list[str]:
    """Of these cache entries, those removed (each with its access-time file): one this process may not remove (a
    read-only cache, which a run still reads) stays, and JAX compiles its program anyway."""
    removed = []
    for path in paths:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError:  # raised from inside JAX's warning, it would fail the compile the warning is about
            continue
        with contextlib.suppress(OSError):
            os.remove(path[: -len("-cache")] + "-atime")
        removed.append(path)
    return removed


def _decompresses(data: bytes, zstandard) -> bool:
    if zstandard is not None:
        try:
            zstandard.ZstdDecompressor().decompress(data)
            return True
        except zstandard.ZstdError:
            pass
    try:
        zlib.decompress(data)
        return True
    except zlib.error:
        return False


def unusable_backend() -> str | None:
    """Why JAX cannot start the backend JAX_PLATFORMS names on this machine (a GPU image run without its GPU: JAX
    raises a RuntimeError or a bare AssertionError), as a message naming the fix; None when it starts."""
    import jax

    try:
        jax.default_backend()
    except (RuntimeError, AssertionError) as e:
        why = str(e).strip().splitlines()[0][:300] if str(e).strip() else "no such backend is installed"
        return (f"JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS', '')}: JAX cannot start that backend on this machine "
                f"({why}); unset JAX_PLATFORMS to use the backend this machine has, or run where that one is")
    return None
