#!/usr/bin/env bash
# The prepared GPU check (issue 14): one command, under 8 minutes on one H200.
#
#   bash scripts/gpu/check.sh [OUT_DIR] [--cpu-dry-run]
#
# OUT_DIR defaults to $OUT (the device tool's output folder: there the logs and results end up in
# one archive, gpu-check.tgz, beside summary.txt), else ./gpu-check-out. Steps, each
# under its own time limit, each writing its log (and results) into OUT_DIR:
#   1 env          jax version and devices; install the checkout with `pip install --no-deps -e .`
#                  (the device machine has its own jax and no network)
#   2 kernels      the compiled (non-interpret) Pallas kernel tests with HELIOS_TEST_PLATFORM=gpu;
#                  fails if any compiled test class skipped ("compiled Pallas needs a GPU")
#   3 attention    scripts/gpu/attention_bench.py: Pallas (split-KV by shape), Pallas without
#                  split and XLA at engine shapes: agreement and median times
#   4 prepare      python -m helios_jax.prepare --measure: the measured catalog (catalog.json)
#   5 conformance  python -m helios_jax.conformance on that catalog
#   6 engine       scripts/bench/engine.py --systems=helios,naive --concurrency=1,16 --repeats=1
#   7 intervals    scripts/bench/intervals.py on the engine engine.py serves: host time per frame by
#                  phase, frames already queued, and each program's reported interval against its
#                  bare execution (the host share left in a duration sample)
# summary.txt lists every step's verdict and seconds; the exit status is non-zero if any failed.
# HELIOS_CHECK_STEPS names the steps to run (default: all seven, in this order), e.g.
# HELIOS_CHECK_STEPS="env kernels prepare conformance" for a rerun inside what is left of a lease.
#
# --cpu-dry-run runs the same steps on the CPU with tiny settings: the interpret-mode kernel
# tests (and a self-test that the skip check trips on the compiled classes, which skip there),
# the attention bench with --tiny, a tiny catalog, and a tiny engine benchmark.
set -uo pipefail

DRY=0
OUT_DIR=""
for arg in "$@"; do
  case "$arg" in
    --cpu-dry-run) DRY=1 ;;
    -*) echo "unknown option $arg" >&2; exit 2 ;;
    *) OUT_DIR="$arg" ;;
  esac
done
OUT_DIR="${OUT_DIR:-${OUT:-./gpu-check-out}}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$REPO"
PY="${PYTHON:-python3}"
CACHE_DIR="${HELIOS_CHECK_CACHE:-/tmp/helios-gpu-check-cache}"  # compiled programs, not results
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
SUMMARY="$OUT_DIR/summary.txt"
: > "$SUMMARY"
FAILED=0

if [ "$DRY" = 1 ]; then
  export HELIOS_TEST_PLATFORM=cpu JAX_PLATFORMS=cpu
  KERNEL_TESTS="SplitKvKernelInterpret or lower_to_one_triton_kernel or lowers_to_triton"
  SKIP_SELFTEST="SplitKvKernel and not Interpret"
  BENCH_ARGS="--tiny"
  PREPARE_ARGS="--concurrency=2 --max_model_len=128 --prefill_chunks=32 --speculation=off --measure_runs=1"
  ENGINE_ARGS="--dtypes=float32 --concurrency=1 --prompt_tokens=16 --new_tokens=8 --max_model_len=128
    --decode=false"
  INTERVALS_ARGS="--dtype=float32 --concurrency=1 --repeats=1 --new_tokens=8 --prompt_tokens=16
    --decode_steps=1 --bare_runs=3"
else
  export HELIOS_TEST_PLATFORM=gpu JAX_PLATFORMS=cuda
  KERNEL_TESTS="((AttentionKernel or AllocationKernel or SplitKvKernel) and not Interpret)
    or lowers_to_triton or lower_to_one_triton_kernel or runtime_value"
  SKIP_SELFTEST=""
  BENCH_ARGS="--runs=20"
  PREPARE_ARGS="--max_model_len=1024 --prefill_chunks=64,256,1024 --measure_runs=5"
  ENGINE_ARGS="--dtypes=bfloat16 --concurrency=1,16 --new_tokens=64 --decode_runs=10"
  INTERVALS_ARGS="--dtype=bfloat16 --concurrency=1,16 --repeats=1 --new_tokens=64 --decode_steps=1,4,8"
fi

# step NAME LIMIT_S COMMAND...: runs COMMAND under `timeout`, its output in NAME.log. The GPU
# limits add up to 555 s (the first H200 run took 10, 13-20, over 60,
# 48, 65 and 104 s for the first six); the CPU dry run (2 shared cores are slow) gets three times as long.
STEPS=" ${HELIOS_CHECK_STEPS:-env kernels attention prepare conformance engine intervals} "
step() {
  local name="$1" limit=$(($2 * (DRY ? 3 : 1)))
  shift 2
  if [[ "$STEPS" != *" $name "* ]]; then
    printf '%-12s %-34s %4ss\n' "$name" "not asked (HELIOS_CHECK_STEPS)" 0 | tee -a "$SUMMARY"
    return 0
  fi
  local start=$SECONDS
  echo "== $name (limit ${limit}s): $*" | tee -a "$OUT_DIR/$name.log"
  # bash -c: the command may be one of the exported functions below.
  timeout "$limit" bash -c '"$@"' step "$@" >> "$OUT_DIR/$name.log" 2>&1
  local rc=$?
  local verdict=ok
  [ "$rc" = 0 ] || { verdict="FAILED (exit $rc$([ "$rc" = 124 ] && echo ', time limit'))"; FAILED=1; }
  printf '%-12s %-34s %4ss\n' "$name" "$verdict" "$((SECONDS - start))" | tee -a "$SUMMARY"
  tail -n 3 "$OUT_DIR/$name.log"
  return "$rc"
}

# A compiled kernel class that skipped means the GPU never ran it: a failure, not a pass.
no_compiled_skips() {
  if grep -q "compiled Pallas needs a GPU" "$1"; then
    echo "compiled kernel tests were SKIPPED ($(grep -c 'compiled Pallas needs a GPU' "$1") lines): not on a GPU"
    return 1
  fi
  grep -Eq "[0-9]+ passed" "$1" || { echo "no kernel test passed"; return 1; }
}

environment() {
  nvidia-smi -L 2>/dev/null || echo "(no nvidia-smi)"
  "$PY" -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())" || return 1
  "$PY" -m pip list 2>/dev/null | grep -iE "^(jax|jaxlib|jax-cuda[0-9]*-(plugin|pjrt)|flax|optax|chex|numpy|torch|transformers|triton|tokenizers|setuptools) " || true
  if [ "$DRY" = 0 ]; then
    "$PY" -m pip install -q --no-deps --no-build-isolation -e . || echo "(pip install failed: PYTHONPATH serves)"
  fi
  "$PY" - <<'PY'
import jax
from helios_jax.kernels.jax_compat import TRITON_PROBLEM
from helios_jax.prepare import default_dtype
print("backend", jax.default_backend(), "default dtype", default_dtype(), "triton:", TRITON_PROBLEM or "available")
major, minor = (int(x) for x in jax.__version__.split(".")[:2])
if not (0, 10) <= (major, minor) < (0, 12):
    print(f"WARNING: jax {jax.__version__} is outside the tested range >=0.10.2,<0.12")
PY
}

kernel_tests() {
  local log="$OUT_DIR/kernels.pytest.log"
  # On the GPU machine (16 cores) four pytest workers compile the kernels' programs side by side.
  local workers=""
  if [ "$DRY" = 0 ] && "$PY" -c "import xdist" 2>/dev/null; then workers="-n 4"; fi
  # shellcheck disable=SC2086
  "$PY" -m pytest -q -rs -p no:cacheprovider $workers tests/kernels -k "$(echo $KERNEL_TESTS)" \
    --junitxml="$OUT_DIR/kernels.junit.xml" > "$log" 2>&1
  local rc=$?
  tail -n 25 "$log"
  no_compiled_skips "$log" || rc=1
  if [ -n "$SKIP_SELFTEST" ]; then  # the dry run: the check must catch the compiled classes' skips
    "$PY" -m pytest -q -rs -p no:cacheprovider tests/kernels -k "$SKIP_SELFTEST" > "$log.selftest" 2>&1
    if no_compiled_skips "$log.selftest" > /dev/null; then
      echo "skip-check self-test FAILED: compiled classes skipped on the CPU and were not caught"
      rc=1
    else
      echo "skip-check self-test ok: the compiled classes' skips on the CPU are caught"
    fi
  fi
  return "$rc"
}

conformance() {
  [ -s "$OUT_DIR/catalog.json" ] || { echo "no catalog.json (prepare failed)"; return 1; }
  "$PY" -m helios_jax.conformance --catalog="$OUT_DIR/catalog.json" --json_out="$OUT_DIR/conformance.json"
}

export OUT_DIR PY DRY KERNEL_TESTS SKIP_SELFTEST
export -f no_compiled_skips environment kernel_tests conformance

step env 30 environment
step kernels 45 kernel_tests
step attention 90 "$PY" scripts/gpu/attention_bench.py $BENCH_ARGS --json_out="$OUT_DIR/attention.json"
# shellcheck disable=SC2086
step prepare 100 "$PY" -m helios_jax.prepare $PREPARE_ARGS --measure \
  --catalog_out="$OUT_DIR/catalog.json" --compilation_cache_dir="$CACHE_DIR"
step conformance 80 conformance
# shellcheck disable=SC2086
step engine 120 "$PY" scripts/bench/engine.py --systems=helios,naive --repeats=1 $ENGINE_ARGS \
  --json_out="$OUT_DIR/engine.json" --compilation_cache_dir="$CACHE_DIR"

# The engine step's programs come from the compilation cache (the same engine, dtype and steps).
# shellcheck disable=SC2086
step intervals 90 env JAX_COMPILATION_CACHE_DIR="$CACHE_DIR" "$PY" scripts/bench/intervals.py --engine=bench \
  --readers=loop $INTERVALS_ARGS --json_out="$OUT_DIR/intervals.json"

# The device tool returns at most eight files from $OUT: writing there, keep the summary and
# one archive of everything.
if [ -n "${OUT:-}" ] && [ "$OUT_DIR" = "$(cd "$OUT" && pwd)" ]; then
  tar czf /tmp/gpu-check.tgz -C "$OUT_DIR" . && find "$OUT_DIR" -mindepth 1 ! -name summary.txt -delete &&
    mv /tmp/gpu-check.tgz "$OUT_DIR/" && echo "archived the logs and results in $OUT_DIR/gpu-check.tgz"
fi

echo "---- summary ($OUT_DIR)"
cat "$SUMMARY"
exit "$FAILED"
