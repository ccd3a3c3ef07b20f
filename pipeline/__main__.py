"""`python -m pipeline ...` is the same as the `docscore` command."""
import sys

from pipeline.cli import main

sys.exit(main())
