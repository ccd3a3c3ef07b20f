"""The `docscore` command: dispatches a subcommand to the module that owns it.

Holds the table of subcommands (each owning module exposes `main(argv) -> int`) and what every subcommand's
process shares: the parser class they use (SubcommandParser), control characters written as escapes (TerminalText),
--version, and the message for a docscore package shadowed by another. Must not parse the subcommands' own flags.
"""
from __future__ import annotations

import argparse
import difflib
import gc
import importlib
import os
import re
import sys

from pipeline.interrupt import (ends_without_shutdown, exit_on_interrupt, exit_with_on_signal, hold_standard_streams,
                                reader_gone)

OWN_PACKAGES = ("pipeline", "models", "kernels", "runners")
# subcommand -> (module with main(argv) -> int, one-line help)
SUBCOMMANDS = {
    "run": ("pipeline.launch", "run the evaluation pipeline (Beam) over document shards"),
    "convert": ("pipeline.convert", "convert a Hugging Face model directory to a docscore model directory"),
    "compare": ("pipeline.runs.compare", "compare two runs: score drift, label flips, timing change"),
    "report": ("pipeline.runs.report", "write the HTML report of a finished run"),
}


class SubcommandParser(argparse.ArgumentParser):
    """A subcommand's flags as `docscore run` takes its own: no abbreviations (argparse would accept --max_mean_drif
    for --max_mean_drift, which run refuses), and an unknown flag answered with the closest known one."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def parse_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        flags = {option for action in self._actions for option in action.option_strings}
        # unknown flags first: a misspelt required flag (--ou for --out) is then named, not reported as missing;
        # after a bare "--" every argument is a value, as argparse reads it
        options = args[:args.index("--")] if "--" in args else args
        self._refuse_unknown([arg for arg in options if arg.startswith("--") and arg.split("=", 1)[0] not in flags])
        parsed, unknown = self.parse_known_args(args, namespace)
        self._refuse_unknown(unknown)
        return parsed

    def _refuse_unknown(self, unknown: list[str]) -> None:
        if not unknown:
            return
        known = sorted(set(re.findall(r"--[a-z][a-z0-9_-]*", self.format_help())))
        flags = [arg for arg in unknown if arg.startswith("-")] or unknown  # an unknown flag's value is no news
        parts = []
        for arg in flags:
            close = difflib.get_close_matches(arg.split("=", 1)[0], known, n=1, cutoff=0.6)
            parts.append(f"{arg} (did you mean {close[0]}?)" if close and arg.startswith("--") else arg)
        self.error(f"unknown argument{'s' if len(parts) > 1 else ''} {', '.join(parts)}")


def shadowed_package(error: ImportError) -> str | None:
    """What to say when an import failed because one of docscore's packages is not docscore's: a folder or another
    distribution of the same top-level name found first, or installed over it (Hugging Face's `kernels` package
    writes kernels/__init__.py into the same site-packages folder); None for any other import error."""
    top = (error.name or "").split(".")[0]
    if top not in OWN_PACKAGES:
        return None
    found = getattr(sys.modules.get(top), "__file__", None)
    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    elsewhere = found is None or os.path.dirname(os.path.dirname(os.path.abspath(found))) != ours
    if not (elsewhere or installed_over(top, found)):
        return None  # docscore's own package: a genuine import error, whose traceback must show
    where = found or "a folder without __init__.py"
    return (f"the package {top!r} this Python imports ({where}) is not docscore's ({error}): another distribution or "
            f"folder named {top!r} shadows or replaced it (Hugging Face's `kernels` installs one): uninstall that one "
            f"(`pip uninstall {top}`; where it was installed over docscore's, then reinstall docscore's wheel with "
            "`pip install --force-reinstall --no-deps`), or run where that folder is not on the Python path")


def installed_over(top: str, found: str | None) -> bool:
    """Whether `found`, the top-level package `top`'s __init__.py, is not the file docscore's installed distribution
    wrote there (its RECORD's hash): another distribution wrote over it. False where that cannot be told (an
    editable install, whose RECORD does not list the source files)."""
    import base64
    import hashlib
    import importlib.metadata

    try:
        files = importlib.metadata.files("docscore") or []
    except importlib.metadata.PackageNotFoundError:
        return False
    for record in files:
        if str(record) == f"{top}/__init__.py" and record.hash and found:
            if not os.path.exists(record.locate()) or not os.path.samefile(record.locate(), found):
                return False
            with open(found, "rb") as f:
                digest = base64.urlsafe_b64encode(hashlib.new(record.hash.mode, f.read()).digest()).rstrip(b"=").decode()
            return digest != record.hash.value
    return False


def installed_version() -> str:
    """The installed distribution's version (what summary.json records under versions.docscore)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("docscore")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def usage() -> str:
    lines = ["usage: docscore COMMAND [options] | docscore --version", "", "commands:"]
    lines += [f"  {name:<9} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "`docscore COMMAND --help` describes each command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    # Processes a command starts (Beam's multi_processing workers are `python -m ...` subprocesses)
    # run with PYTHONSAFEPATH=1: Python then leaves the working directory off their sys.path, so a
    # user's folder named models/, kernels/, pipeline/ or runners/ there is never imported in place
    # of docscore's packages (the `docscore` process itself never has it; pipeline/__main__.py drops
    # it for `python -m pipeline`). Restored afterwards for a caller that runs main in-process.
    before = os.environ.get("PYTHONSAFEPATH")
    os.environ["PYTHONSAFEPATH"] = "1"
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = TerminalText(sys.stdout), TerminalText(sys.stderr)
    try:
        with exit_on_interrupt(lambda: "docscore: interrupted"):  # until the subcommand says more
            return _dispatch(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:  # the reader went away (`docscore --help | head`)
        return reader_gone()
    finally:
        sys.stdout, sys.stderr = streams
        if before is None:
            os.environ.pop("PYTHONSAFEPATH", None)
        else:
            os.environ["PYTHONSAFEPATH"] = before


# Control characters as escapes (\x1b), but tab, line feed and carriage return (progress bars use \r).
CONTROL_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c not in (0x09, 0x0A, 0x0D)}


class TerminalText:
    """A text stream that writes control characters as escapes: messages quote data (field names, file names,
    labels, paths), and an escape sequence in it would act on the reader's terminal (clear it, hide lines, make a
    link) instead of being read. Everything else passes to the wrapped stream."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(text.translate(CONTROL_ESCAPES))

    def __getattr__(self, name):
        return getattr(self._stream, name)


def entry() -> int:
    """The `docscore` command and `python -m pipeline`: main(), after which the process ends. Every object
    still alive then (jax, Beam and matplotlib modules, the model: millions) is frozen out of Python's garbage
    collector first, so the interpreter's shutdown does not rescan them all: about 1 s after a run
    (benchmarks/README.md, "Start-up"). A caller that runs main() in-process keeps collecting as before. A command
    that leaves threads inside native code (interrupt.end_without_shutdown) ends with os._exit instead."""
    hold_standard_streams()
    code = main()
    exit_with_on_signal(code)  # the command is done: a late signal must not turn its outcome into 130/143
    if ends_without_shutdown():  # threads of a failed job may be inside native code: the shutdown would abort
        os._exit(code)  # exit_with_on_signal has flushed stdout and stderr
    gc.freeze()
    return code


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"docscore {installed_version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        close = difflib.get_close_matches(name, list(SUBCOMMANDS), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        print(f"docscore: unknown command {name!r}{hint}\n\n{usage()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(SUBCOMMANDS[name][0])
    except ImportError as e:  # `python -m pipeline` with a Python that docscore is not installed in
        problem = shadowed_package(e)
        if problem:
            print(f"docscore: {problem}", file=sys.stderr)
            return 2
        if (e.name or "").split(".")[0] in OWN_PACKAGES or not isinstance(e, ModuleNotFoundError):
            raise
        checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        fix = ("use the one `make install` set up (.venv/bin/docscore, or .venv/bin/python -m pipeline), or "
               f"`pip install -e {checkout}`") if os.path.exists(os.path.join(checkout, "Makefile")) else (
               "install docscore with its dependencies into it (`pip install` of docscore's wheel or sdist, without "
               "--no-deps; `pip check` lists what is missing)")
        print(f"docscore: {e.name} is not installed in this Python ({sys.executable}): {fix}", file=sys.stderr)
        return 2
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(entry())
