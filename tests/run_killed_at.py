"""`python tests/run_killed_at.py N OUTPUT LOG -- DOCSCORE-RUN-ARGS`: a real `docscore run` process that kills
itself with SIGKILL just before its Nth atomic file step under OUTPUT (os.replace: placing a staged file,
writing a history row, the summary, the report), logging each such step's destination to LOG first.
N=0 never kills. Used by tests/test_run_faults.py to stop a run at chosen file operations; nothing of
this is in docscore."""
from __future__ import annotations

import os
import signal
import sys


def main() -> int:
    kill_at, output, log = int(sys.argv[1]), os.path.abspath(sys.argv[2]), sys.argv[3]
    args = sys.argv[sys.argv.index("--") + 1:]
    real_replace, calls = os.replace, [0]

    def replace(src, dst, *rest, **kwargs):
        if not os.path.abspath(dst).startswith(output + os.sep):
            return real_replace(src, dst, *rest, **kwargs)
        calls[0] += 1
        with open(log, "a") as f:
            f.write(f"{calls[0]} {dst}\n")
        if calls[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real_replace(src, dst, *rest, **kwargs)

    os.replace = replace
    from pipeline.launch import main as docscore_run

    return docscore_run(args)


if __name__ == "__main__":
    sys.exit(main())
