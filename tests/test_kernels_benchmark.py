"""benchmarks/gpu_kernels.py runs on CPU (--quick: small shapes, Pallas interpreted) so the script a GPU
session runs is known to work before device time is spent on it: the precision section (docscore's
float32 matmul precisions), the section choice, the budget, and the JSON it leaves."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.integration  # a subprocess compiling a few dozen programs (~20 s): README.md, "Development"


def run_script(tmp_path: Path, *flags: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "OUT": str(tmp_path), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_kernels.py"), "--quick", *flags],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return done, json.loads((tmp_path / "gpu_kernels.json").read_text())


def test_precision_section_on_cpu(tmp_path):
    done, results = run_script(tmp_path, "--sections", "precision", "--budget-s", "300")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert results["sections"] == ["precision"] and not results["failures"] and not results["skipped"]
    entries = results["precision"]
    dense = [e for e in entries if e["case"] == "dense"]
    assert {e["matmul"] for e in dense} == {"minilm qkv", "minilm ffn up", "minilm ffn down", "bert-base ffn up"}
    for e in dense:
        if e["matmul_precision"] == "tf32":  # XLA:CPU refuses the TF32 preset: recorded, not failed
            assert e["status"].startswith("unsupported") and "ms" not in e
        else:
            assert e["ms"] > 0 and e["error"] < 1e-5
    long = {e["matmul_precision"]: e for e in entries if e["case"] == "attention float64"}
    assert set(long) == {"highest", "default"} and long["highest"]["within_f32_bound"]
    assert "## float32 dense matmuls" in done.stdout and "| minilm ffn up [384x1536] |" in done.stdout


def test_budget_skips_cases_and_says_so(tmp_path):
    done, results = run_script(tmp_path, "--sections", "timing", "pipeline", "--timing-causal", "none",
                               "--budget-s", "0")
    assert done.returncode == 0, done.stderr[-2000:]
    assert results["timing"] == [] and results["pipeline"] == []
    assert "timing xla 128 causal=False" in results["skipped"] and "pipeline cudnn 8x128" in results["skipped"]
    assert not any("causal=True" in s for s in results["skipped"])  # --timing-causal none planned none
