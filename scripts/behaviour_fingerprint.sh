#!/usr/bin/env bash
# Behaviour fingerprint: deterministic outputs that a restructure must leave unchanged.
#
#   bash scripts/behaviour_fingerprint.sh OUT_DIR      # then: diff -r BEFORE_DIR AFTER_DIR
#
# Writes, one file each: the selector against exhaustive enumeration (crosscheck), the startup
# traces and budgets of the conformance suite on both shipped catalogs, simulator runs (startup and
# Poisson with noise; every plan's kind, width, depth and time), a small policy comparison against
# the baselines, and the engine's greedy token ids on the embedded model in every speculation mode.
# Timings are left out (wall-clock figures vary run to run); everything written is deterministic.
set -euo pipefail
out=${1:?usage: behaviour_fingerprint.sh OUT_DIR}
mkdir -p "$out"
PY=${PY:-python}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
export JAX_PLATFORMS=cpu
# Scripts import this checkout's package, not whatever an editable install points at.
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"

$PY -m helios_jax.reference.crosscheck --cases=150 --seed=1 > "$out/crosscheck.txt"
for cat in synthetic-h200 synthetic-h200-ordinary; do
  $PY -m helios_jax.conformance --catalog="helios_jax/catalogs/$cat.json" \
    --sections=catalog,selection,startup,budgets,lifecycle 2>&1 | grep -v -i "seconds\|elapsed\| s$" > "$out/conformance-$cat.txt" || true
done
$PY scripts/scheduling_sim/run.py --scenario=startup --requests=16 --json_out="$out/sim-startup.json" > /dev/null
$PY scripts/scheduling_sim/run.py --scenario=poisson --requests=40 --noise=0.2 --acceptance_probs=0.8,0.6,0.4 \
  --accepted_drafts=-1 --prompt_tokens=64,900,3000 --output_tokens=32,200 --json_out="$out/sim-poisson.json" > /dev/null
$PY scripts/scheduling_sim/compare.py --loads=7,16 --seeds=1 --requests=30 --json_out="$out/compare.json" > /dev/null
$PY scripts/behaviour_fingerprint_engine.py > "$out/engine-greedy.txt"
echo "fingerprint written to $out"
