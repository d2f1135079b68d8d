# Issue 6, step 12 (fifth session): two-stage 64x64 tiles (two blocks per SM at d = 128) in every kernel's
# sweep, then the section 1 commands with them in the config lists.
# Run on the GPU machine from the repository root: bash scripts/gpu_step12_measure.sh (writes to $OUT).
set -uo pipefail
. .gpu/setup.sh >/dev/null
export PYTHONPATH=$PWD:${PYTHONPATH:-}
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $1"; }
timeout 300 python3 scripts/flash_tune.py --loads tma --overlap both --workers 14 \
    --output "$OUT/tune12-stages.json" > "$OUT/tune12-stages.md" 2> /tmp/tune.err
tail -2 /tmp/tune.err; stamp sweep
timeout 110 python3 -m profiler_kit attention leaderboard --output "$OUT/attention-leaderboard-step12-h100.jsonl" \
    --format markdown 2>/tmp/lb.err || tail -5 /tmp/lb.err
stamp leaderboard
for args in "--seq 4096 --causal" "--seq 8192 --no-causal"; do
  timeout 80 python3 -m profiler_kit attention bench --impl flash-triton,sdpa-cudnn,sdpa-flash --batch 4 \
      --heads 16 --d 128 --dtype bf16 $args --output "$OUT/attention-issue6-step12-h100.jsonl" --format markdown \
      2>/tmp/b.err | grep -A6 "^### timings\|^### memory" || tail -5 /tmp/b.err
done
stamp issue6
