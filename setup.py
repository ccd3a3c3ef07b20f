"""docscore: a Beam batch evaluation pipeline for Flax models with replaceable attention kernels.

Runtime dependencies are pinned exactly so a Dataflow worker and a laptop compute the same
thing. PyTorch and its ecosystem are test/benchmark extras only (reference implementations);
they never enter the runtime.
"""
from setuptools import find_packages, setup

RUNTIME = [
    "apache-beam[gcp]==2.77.0",
    "jax==0.10.2",
    "jaxlib==0.10.2",
    # jax's own dtype package, held at 0.6.0: 0.7.0 registers its numpy loops in a way that takes ~0.5 s
    # at every import, in the launcher and every worker (benchmarks/README.md, "Start-up").
    "ml-dtypes==0.6.0",
    "flax==0.12.8",
    "orbax-checkpoint==0.12.8",
    "numpy==2.4.6",
    "tokenizers==0.23.3",
    "safetensors==0.8.0",
    "pyarrow==25.0.1",
    "fsspec==2026.9.0",
    "gcsfs==2026.10.1",
    "PyYAML==6.0.4",
    "psutil==7.2.2",
    "array-record==0.8.6",
    "matplotlib==3.11.2",
    "scipy==1.17.1",  # the run's correlations (scipy.stats Spearman/Pearson) in pipeline/stages/scoring.py
    # imported by docscore's own code, so declared, though Beam[gcp] and gcsfs bring them too
    "aiohttp==3.14.5",  # gcsfs's HTTP client: pipeline/io/sources.py tells its errors apart
    "google-cloud-bigquery==3.47.0",  # bq: outputs (pipeline/io/bigquery.py)
    "google-api-core==2.44.0",
    "protobuf==6.33.6",  # TFDS features.json (pipeline/io/tfds_reader.py)
]

# Querying the tables (README, "Querying the tables"); not needed to run a job.
QUERY = ["duckdb==2.0.1", "pandas==3.1.1"]

# Reference implementations and test services. torch must be installed first as
# torch==2.13.0 (a CPU build); the Makefile does that, see README.
TEST = [
    "pytest==9.2.0",
    "pytest-xdist==3.8.0",  # `make test` runs the suite on two worker processes
    "torch==2.13.0",
    "transformers==5.24.0",
    "sentence-transformers==6.3.0",
    "gcp-storage-emulator==2026.7.19",
    "tensorflow-datasets==4.9.10",  # builds TFDS array_record fixtures in tests; no TensorFlow needed
    "selenium==4.51.0",  # drives headless Chromium (Debian chromium + chromium-driver) for the report test
    *QUERY,
]

TOP_LEVEL = ("pipeline", "models", "kernels", "runners")

setup(
    name="docscore",
    version="0.1.0",
    description="Batch evaluation pipeline: Beam + Flax with replaceable attention kernels",
    python_requires=">=3.11,<3.12",
    # Every package under the four top-level folders, found rather than listed (a hand-kept list
    # once left pipeline.tasks out of the sdist Dataflow workers install).
    packages=find_packages(include=[f"{top}{sub}" for top in TOP_LEVEL for sub in ("", ".*")]),
    # The packages' parent folder is the import root, so an editable install (`pip install -e .`)
    # puts this folder on sys.path instead of a finder consulted after sys.path: a folder without
    # __init__.py named like a package (an empty models/ in the working directory) never wins
    # over a real package, installed or editable. (pipeline/cli.py keeps the working directory
    # off the path of docscore's processes and workers; tests/test_install_names.py.)
    package_dir={"": "."},
    package_data={"runners": ["presets/*.yaml", "schedules/*.yaml", "Dockerfile", "*.json", "*.md"]},
    install_requires=RUNTIME,
    extras_require={"test": TEST, "bench": TEST, "query": QUERY},
    entry_points={"console_scripts": ["docscore=pipeline.cli:entry"]},
)
