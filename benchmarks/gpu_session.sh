#!/usr/bin/env bash
# One lent GPU machine's session in one command: the GPU tests, the kernel figures, docscore against
# sentence-transformers end to end, and the host work alone, most needed first, each under its own limit and
# each writing to $OUT as it goes, so a cut step keeps what it finished (benchmarks/README.md, "A GPU session").
#
#   here, once:   bash benchmarks/gpu_session.sh prepare RECIPE   # RECIPE: folder holding fetch_wheels.sh,
#                                                                 # make_corpus.py, prepare.sh (the GPU recipe)
#   there:        RECIPE=.gpu bash benchmarks/gpu_session.sh run  # carry RECIPE; limits below are seconds
#   here, to try: DEVICE=cpu RECIPE=.gpu TESTS_S=60 KERNELS_S=30 E2E_S=120 HOST_S=60 \
#                     KERNEL_ARGS=--quick PEERS_ARGS="--docs 300 --quick" bash benchmarks/gpu_session.sh run
set -uo pipefail
cd "$(dirname "$0")/.."
RECIPE=${RECIPE:-.gpu}
export OUT=${OUT:-$(mktemp -d)}  # gpu_kernels.py writes its JSON there
mkdir -p "$OUT"
# Limits (seconds) within one device call of <= 595 s: the host steps (CPU only) run beside the tests and kernels,
# which keep the CPU idle, and end before the end-to-end runs, which time the host.
TESTS_S=${TESTS_S:-80} KERNELS_S=${KERNELS_S:-130} E2E_S=${E2E_S:-330} HOST_S=${HOST_S:-90}
KERNEL_ARGS=${KERNEL_ARGS:---sections precision pipeline timing tiles --lengths 8192 16384 32768 --timing-causal all --repeats 5 --budget-s 110}
PEERS_ARGS=${PEERS_ARGS:---peers float32:256 bfloat16:256 --runs bf16_flash bf16_flash bert12_bf16_flash bert12_bf16_flash bf16_flash_4procs bf16_flash_1thread bf16_flash_4threads}
export PYTHONUNBUFFERED=1

step() {  # step NAME SECONDS COMMAND...: SIGINT at the limit, so pytest and the scripts still print what they have
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout -s INT -k 10 "$limit" "$@" > "$OUT/$name.txt" 2>&1
  echo "== $name rc=$? in $((SECONDS - start)) s (limit $limit)" | tee -a "$OUT/$name.txt"
  tail -n 40 "$OUT/$name.txt"
}

if [ "${1:-}" = prepare ]; then
  src=${2:?"prepare RECIPE: the GPU recipe's folder"}
  mkdir -p "$RECIPE" && cp -r "$src"/. "$RECIPE"/ && chmod -R u+w "$RECIPE"
  bash "$RECIPE/prepare.sh"
  # pytest and what it imports, for the GPU tests (the machine has no pytest and no network)
  .venv/bin/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp -d "$RECIPE/whl" pytest pluggy iniconfig packaging
  du -sh "$RECIPE"
  exit 0
fi
[ "${1:-}" = run ] || { echo "usage: $0 prepare RECIPE | run" >&2; exit 2; }

# The machine's own jax, flax and torch, with Beam's wheels beside them (setup.py's Python bound excludes a
# pip install there, so the checkout runs from source).
DEVICE=${DEVICE:-cuda}
if [ "$DEVICE" = cuda ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/env.txt" 2>&1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "$RECIPE"/whl/*.whl >> "$OUT/env.txt" 2>&1
  export PYTHONPATH=/tmp/site:$PWD PY=python3 PLATFORMS=cuda,cpu
else
  export PY=.venv/bin/python PLATFORMS=cpu DEVICE
fi
lscpu | grep -E '^Model name|^CPU\(s\)' >> "$OUT/env.txt"
# docscore on a jax that is not the pinned one: the kernels and models must import before device time goes to
# runs; Beam (wheels for another Python) only for the steps that run `docscore run`.
$PY -c "import jax, flax, tokenizers, models, kernels
print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())" >> "$OUT/env.txt" 2>&1 \
  || { cat "$OUT/env.txt"; echo "docscore's models and kernels do not import on this machine's jax: stop here"; exit 1; }
BEAM=1
$PY -c "import apache_beam, pipeline.launch, pipeline.graph; print('beam', apache_beam.__version__)" >> "$OUT/env.txt" 2>&1 \
  || { BEAM=0; echo "Beam does not import here: the end-to-end and host steps are skipped" | tee -a "$OUT/env.txt"; }
cat "$OUT/env.txt"

# The host work alone on this machine's CPU (the stand-in model, JAX on the CPU; one bundle, 2 threads, 4 processes),
# in the background: a random MiniLM converted first (the built-in one's weights are not carried), then each setting
# under a third of what is left of HOST_S.
host_steps() {
  local model=/tmp/docscore-host-minilm host_start=$SECONDS
  step host_model 30 env JAX_PLATFORMS=cpu $PY -c "import sys; sys.path.insert(0, 'benchmarks')
from gpu_peers import random_hf_model; random_hf_model(*sys.argv[1:])" "$RECIPE/minilm" "$model-hf" > /dev/null
  [ -e "$model/metadata.json" ] || step host_convert 30 env JAX_PLATFORMS=cpu $PY -m pipeline convert --hf "$model-hf" \
      --out "$model" > /dev/null
  for setting in "1 in_memory" "2 multi_threading" "4 multi_processing"; do
    set -- $setting
    local left=$(( (HOST_S - (SECONDS - host_start)) / 3 ))
    step "host_$1_$2" $(( left > 5 ? left : 5 )) env JAX_PLATFORMS=cpu $PY benchmarks/pipeline_overhead.py \
        --corpus "$RECIPE/corpus.jsonl.gz" --docs 20000 --rounds 1 --device_us_per_row 85 --host accelerator \
        --flags "--model $model --batch_size 256 --calls_per_beam_batch 4 --direct_num_workers $1 --direct_running_mode $2" > /dev/null
  done
}
if [ "$BEAM" = 1 ]; then host_steps & HOST_PID=$!; fi

step tests "$TESTS_S" env JAX_PLATFORMS=$PLATFORMS $PY -m pytest -v -rfEs --tb=short -p no:cacheprovider tests/test_kernels_gpu.py
# shellcheck disable=SC2086  # the *_ARGS are lists of flags
step kernels "$KERNELS_S" $PY benchmarks/gpu_kernels.py $KERNEL_ARGS
if [ "$BEAM" = 1 ]; then
  wait "$HOST_PID"
  for f in "$OUT"/host_*.txt; do echo "== $(basename "$f")"; tail -n 25 "$f"; done
  # shellcheck disable=SC2086
  step end_to_end "$E2E_S" $PY benchmarks/compare_peers.py --gpu --corpus "$RECIPE/corpus.jsonl.gz" \
      --hf_config "$RECIPE/minilm" --out "$OUT" $PEERS_ARGS
fi
