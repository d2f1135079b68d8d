# Issue 6, step 11 (fourth session): the "overlap" flag swept on the three issue 6 shapes (TMA loads).
# Run on the GPU machine from the repository root: bash scripts/gpu_step11_sweep.sh (writes to $OUT).
set -uo pipefail
. .gpu/setup.sh >/dev/null
export PYTHONPATH=$PWD:${PYTHONPATH:-}
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 300 python3 scripts/flash_tune.py --shapes leaderboard --loads tma --orders both --overlap both \
    --workers 14 --output "$OUT/tune11-leaderboard.json" > "$OUT/tune11-leaderboard.md" 2> /tmp/tune-a.err
tail -2 /tmp/tune-a.err; echo "[$(( $(date +%s) - start ))s] leaderboard"
left=$(( 560 - ($(date +%s) - start) ))
timeout $left python3 scripts/flash_tune.py --shapes causal4096,full8192 --loads tma --overlap both \
    --workers 14 --output "$OUT/tune11-d128.json" > "$OUT/tune11-d128.md" 2> /tmp/tune-b.err
tail -2 /tmp/tune-b.err; echo "[$(( $(date +%s) - start ))s] d128"
