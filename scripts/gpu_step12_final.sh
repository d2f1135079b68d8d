# Issue 6, step 12 (fifth session): GPU tests on the final kernels, the leaderboard twice more, and the
# step 5 grid against SDPA's FA2 backend (eager), which step 11 did not re-run.
# Run on the GPU machine from the repository root: bash scripts/gpu_step12_final.sh (writes to $OUT).
set -uo pipefail
. .gpu/setup.sh >/dev/null
export PYTHONPATH=$PWD:${PYTHONPATH:-}
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $1"; }
timeout 330 python3 -m pytest -q tests/test_attention_kernels.py tests/test_attention_launch.py 2>&1 | tail -3
stamp tests
for run in 2 3; do
  timeout 70 python3 -m profiler_kit attention leaderboard --output "$OUT/attention-leaderboard-step12-run$run-h100.jsonl" \
      --format markdown 2>/dev/null | head -5 | cut -c1-200
done
stamp leaderboard
left=$(( 590 - ($(date +%s) - start) ))
timeout $left python3 -m profiler_kit attention bench --impl flash-triton,sdpa-flash --batch 8 --d 16,32,64,128 \
    --seq 256,1024,4096,8192,16384 --dtype bf16 --output "$OUT/attention-grid-fa2-step12-h100.jsonl" --resume \
    --format markdown > "$OUT/grid-fa2-step12.md" 2>/tmp/grid.err; tail -2 /tmp/grid.err
stamp grid
