"""Put on PYTHONPATH by tests/test_run_faults.py only: a Beam worker process (sdk_worker_main) of a docscore run
kills itself with SIGKILL when it reaches the function of pipeline/io/run_commit.py that
DOCSCORE_TEST_KILL_WORKER_AT names. Nothing of this is in docscore."""
import os
import signal
import sys

_AT = os.environ.get("DOCSCORE_TEST_KILL_WORKER_AT")
if _AT and "sdk_worker_main" in " ".join(sys.argv) + open("/proc/self/cmdline", "rb").read().decode(errors="replace"):
    from pipeline.io import run_commit as _run_commit

    def _killed(*_args, **_kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    setattr(_run_commit, _AT, _killed)
