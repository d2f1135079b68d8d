# Issue 6, step 11 (fourth session): the leaderboard three more times (one process each, so each autotunes
# afresh), then as CUDA graph replays, to see how far one run's ratio can be trusted.
# Run on the GPU machine from the repository root: bash scripts/gpu_step11_repeat.sh (writes to $OUT).
set -uo pipefail
. .gpu/setup.sh >/dev/null
export PYTHONPATH=$PWD:${PYTHONPATH:-}
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $1"; }
for run in 2 3 4; do
  timeout 120 python3 -m profiler_kit attention leaderboard \
      --output "$OUT/attention-leaderboard-step11-run$run-h100.jsonl" --format csv 2>/dev/null | cut -d, -f1-6
  stamp "leaderboard run $run"
done
timeout 150 python3 scripts/attention_graphed.py --impl flash-triton,sdpa-cudnn,sdpa-flash --batch 1 --heads 16 \
    --d 64 --seq 16384 --output "$OUT/attention-graphed-leaderboard-step11-h100.jsonl" 2>&1 | tail -8
stamp graphed
