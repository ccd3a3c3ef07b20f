"""A local runner runs inference on this machine: a --target_backend it does not have is a configuration error
(exit 2) before any data is read, never a run that records one kernel and runs another."""
from __future__ import annotations

import jax
import pytest

from tests.conftest import common_flags, run_docscore

OTHER = [b for b in ("cpu", "gpu", "tpu") if b != jax.default_backend()]


@pytest.mark.parametrize("flags", [
    ["--target_backend", OTHER[0]],
    ["--target_backend", OTHER[-1], "--attention", "flash"],
    ["--target_backend", "tpu", "--attention", "pallas_tpu"] if jax.default_backend() != "tpu" else ["--target_backend", "gpu"],
])
def test_a_backend_the_local_runner_cannot_reach_is_refused_before_reading(flags, corpus, tmp_path, no_data_read, capsys):
    assert run_docscore("--input", corpus, *common_flags("unreachable", tmp_path / "out"), *flags) == 2
    message = capsys.readouterr().err
    assert f"--target_backend={flags[1]} cannot run with the local runner" in message
    assert f"backend is {jax.default_backend()}" in message and "--preset dataflow-" in message
    assert not (tmp_path / "out" / "scores").exists()


def test_the_machines_own_backend_named_explicitly_still_runs(corpus, tmp_path):
    out = tmp_path / "out"
    assert run_docscore("--input", corpus, *common_flags("here", out), "--target_backend", jax.default_backend()) == 0
