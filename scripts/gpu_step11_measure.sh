# Issue 6, step 11 (fourth session): GPU tests, the section 1 commands and a dK/dV sweep on the final kernels.
# Run on the GPU machine from the repository root: bash scripts/gpu_step11_measure.sh (writes to $OUT).
set -uo pipefail
. .gpu/setup.sh >/dev/null
export PYTHONPATH=$PWD:${PYTHONPATH:-}
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $1"; }
timeout 150 python3 -m pytest -q tests/test_attention_kernels.py tests/test_attention_launch.py 2>&1 | tail -2
stamp tests
timeout 120 python3 -m profiler_kit attention leaderboard --output "$OUT/attention-leaderboard-step11-h100.jsonl" \
    --format markdown 2>/dev/null
stamp leaderboard
for args in "--seq 4096 --causal" "--seq 8192 --no-causal"; do
  timeout 120 python3 -m profiler_kit attention bench --impl flash-triton,sdpa-cudnn,sdpa-flash --batch 4 \
      --heads 16 --d 128 --dtype bf16 $args --output "$OUT/attention-issue6-step11-h100.jsonl" --format markdown \
      2>/dev/null
done
stamp issue6
timeout 90 python3 scripts/flash_tune.py --shapes leaderboard --loads tma --overlap both --kernels dkdv \
    --workers 14 --output "$OUT/tune11-dkdv-final.json" > "$OUT/tune11-dkdv-final.md" 2>/dev/null
stamp sweep
timeout 100 python3 scripts/flash_timeline.py > "$OUT/attention-timeline-leaderboard-step11-h100.txt" 2>&1
stamp timeline
