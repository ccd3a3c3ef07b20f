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
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
TESTS_S=${TESTS_S:-90} KERNELS_S=${KERNELS_S:-140} E2E_S=${E2E_S:-270} HOST_S=${HOST_S:-60}
KERNEL_ARGS=${KERNEL_ARGS:---sections precision pipeline timing tiles --lengths 8192 16384 32768 --timing-causal all --repeats 5 --budget-s 120}
PEERS_ARGS=${PEERS_ARGS:---peers float32:256 bfloat16:256 --runs bf16_flash bf16_flash bert12_bf16_flash bert12_bf16_flash bf16_flash_1thread bf16_flash_4procs bf16_flash_4threads}
export PYTHONUNBUFFERED=1

step() {  # step NAME SECONDS COMMAND...: SIGINT at the limit, so pytest and the scripts still print what they have
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout -s INT -k 10 "$limit" "$@" > "$OUT/$name.txt" 2>&1
  echo "== $name rc=$? in $((SECONDS - start)) s (limit $limit)"
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
# docscore on a jax that is not the pinned one: every module must import before device time goes to runs.
$PY -c "import jax, flax, apache_beam, tokenizers, pipeline.launch, pipeline.graph, models, kernels
print('jax', jax.__version__, 'flax', flax.__version__, 'beam', apache_beam.__version__, jax.devices())" >> "$OUT/env.txt" 2>&1 \
  || { cat "$OUT/env.txt"; echo "docscore does not import on this machine's jax: stop here"; exit 1; }
cat "$OUT/env.txt"

step tests "$TESTS_S" env JAX_PLATFORMS=$PLATFORMS $PY -m pytest -v -rfEs --tb=short -p no:cacheprovider tests/test_kernels_gpu.py
# shellcheck disable=SC2086  # the *_ARGS are lists of flags
step kernels "$KERNELS_S" $PY benchmarks/gpu_kernels.py $KERNEL_ARGS
# shellcheck disable=SC2086
step end_to_end "$E2E_S" $PY benchmarks/compare_peers.py --gpu --corpus "$RECIPE/corpus.jsonl.gz" \
    --hf_config "$RECIPE/minilm" --out "$OUT" $PEERS_ARGS
# The host work alone on this machine's CPU (the stand-in model; JAX on the CPU), a third of HOST_S each.
for setting in "1 in_memory" "2 multi_threading" "4 multi_processing"; do
  set -- $setting
  step "host_$1_$2" $((HOST_S / 3)) env JAX_PLATFORMS=cpu $PY benchmarks/pipeline_overhead.py \
      --corpus "$RECIPE/corpus.jsonl.gz" --docs 40000 --rounds 1 --device_us_per_row 85 --host accelerator \
      --flags "--batch_size 256 --calls_per_beam_batch 4 --direct_num_workers $1 --direct_running_mode $2"
done
