#!/bin/bash
# Compares two training runs' losses, iteration by iteration, from their
# metrics.jsonl (scripts/gpu_check.sh, scripts/cuda_emu_check.sh):
#   scripts/compare_losses.sh NAME RTOL ITERATIONS RUN_DIR REFERENCE_DIR
# prints "- NAME: N iterations, worst relative loss difference ... (rtol
# RTOL): **passed**" (or **FAILED**) and exits 0 when both runs logged
# ITERATIONS losses that agree within RTOL, relative to the reference's.
set -uo pipefail
if [ $# -ne 5 ]; then
  echo "usage: compare_losses.sh NAME RTOL ITERATIONS RUN_DIR REFERENCE_DIR" >&2
  exit 2
fi
name=$1 rtol=$2 iterations=$3 run=$4 reference=$5
losses() { sed -n 's/.*"iter":\([0-9]*\).*"loss":\([-0-9.eE+]*\).*/\1 \2/p' "$1/metrics.jsonl" 2>/dev/null; }
paste <(losses "$reference") <(losses "$run") | awk -v rtol="$rtol" -v name="$name" -v want="$iterations" '
  { n++; d = $2 - $4; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > worst) worst = r;
    if (r > rtol || $4 == "") bad++ }
  END { printf "- %s: %d iterations, worst relative loss difference %.2e (rtol %s): %s\n", name, n, worst, rtol,
        (n == want && bad == 0) ? "**passed**" : "**FAILED**"; exit !(n == want && bad == 0) }'
