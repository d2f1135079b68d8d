# Issue 6, step 11 (fourth session): the GPU tests, and dK/dV configs capped at 168 registers (three blocks
# per SM) against the uncapped ones on the leaderboard shape.
# Run on the GPU machine from the repository root: bash scripts/gpu_step11_regs.sh (writes to $OUT).
set -uo pipefail
. .gpu/setup.sh >/dev/null
export PYTHONPATH=$PWD:${PYTHONPATH:-}
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $1"; }
timeout 90 python3 scripts/flash_tune.py --shapes leaderboard --loads tma --overlap both --kernels dkdv \
    --workers 14 --output "$OUT/tune11-dkdv-maxnreg.json" > "$OUT/tune11-dkdv-maxnreg.md" 2>/dev/null
stamp sweep
timeout 420 python3 -m pytest -q tests/test_attention_kernels.py tests/test_attention_launch.py 2>&1 | tail -3
stamp tests
