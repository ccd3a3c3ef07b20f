"""Flex Template entry point (FLEX_TEMPLATE_PYTHON_PY_FILE in runners/Dockerfile): the template's
parameters arrive as --name=value flags and go to `docscore run` unchanged.

Holds nothing but the hand-over; must not add options of its own (runners/flex_template_metadata.json
lists the parameters, and they are `docscore run` flags).
"""
import sys

from pipeline.launch import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
