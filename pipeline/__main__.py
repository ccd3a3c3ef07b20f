"""`python -m pipeline ...` is the same as the `docscore` command.

`python -m` puts the working directory first on sys.path; it is dropped here, before anything else
is imported, so a user's own models/, kernels/ or runners/ there is never taken for docscore's
(the `docscore` command never has it on the path). It stays when it is the folder holding this
package (a checkout run from its root), where those folders are docscore's own.
"""
import os
import sys

if not sys.flags.safe_path and sys.path and sys.path[0] in ("", os.getcwd()):
    _here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.realpath(sys.path[0] or ".") != os.path.realpath(_here):
        del sys.path[0]

from pipeline.cli import entry  # noqa: E402 (after the path is safe)

sys.exit(entry())
