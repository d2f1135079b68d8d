# Issue 6, step 13 (sixth session): the final kernels through the section 1 commands (leaderboard twice, the
# two d = 128 configurations) and the GPU tests of the Triton kernels.
# Run on the GPU machine from the repository root: bash scripts/gpu_step13_final.sh (writes to $OUT).
set -uo pipefail
. .gpu/setup.sh >/dev/null
export PYTHONPATH=$PWD:${PYTHONPATH:-}
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $1"; }
for run in 1 2; do
  timeout 110 python3 -m profiler_kit attention leaderboard \
      --output "$OUT/attention-leaderboard-step13-final-run$run-h100.jsonl" --format markdown 2>/tmp/lb.err \
      | grep "flash-triton\|sdpa-cudnn" || tail -5 /tmp/lb.err
  stamp "leaderboard $run"
done
for args in "--seq 4096 --causal" "--seq 8192 --no-causal"; do
  timeout 80 python3 -m profiler_kit attention bench --impl flash-triton,sdpa-cudnn,sdpa-flash --batch 4 \
      --heads 16 --d 128 --dtype bf16 $args --output "$OUT/attention-issue6-step13-final-h100.jsonl" \
      --format markdown 2>/tmp/b.err | grep "flash-triton\|sdpa-cudnn" || tail -5 /tmp/b.err
done
stamp issue6
timeout 330 python3 -m pytest -q tests/test_attention_kernels.py tests/test_attention_launch.py 2>&1 | tail -3
stamp tests
