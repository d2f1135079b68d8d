# Issue 6, step 12 (fifth session): the fused backward (dQ by vector reductions) against the split one.
# Run on the GPU machine from the root of a checkout of commit 55a7fa7, the only one with the fused kernel
# (later, flash_tune.py has no "fused" kernel and the sweep would time the split one alone):
# bash scripts/gpu_step12_sweep.sh (writes to $OUT).
set -uo pipefail
. .gpu/setup.sh >/dev/null
export PYTHONPATH=$PWD:${PYTHONPATH:-}
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $1"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 260 python3 scripts/flash_tune.py --loads tma --overlap both --kernels fused,dkdv --workers 14 \
    --output "$OUT/tune12.json" > "$OUT/tune12.md" 2> /tmp/tune.err
tail -3 /tmp/tune.err; stamp sweep
timeout 110 python3 -m profiler_kit attention leaderboard --output "$OUT/attention-leaderboard-step12-h100.jsonl" \
    --format markdown 2>/tmp/lb.err || tail -5 /tmp/lb.err
stamp leaderboard
for args in "--seq 4096 --causal" "--seq 8192 --no-causal"; do
  timeout 90 python3 -m profiler_kit attention bench --impl flash-triton,sdpa-cudnn,sdpa-flash --batch 4 \
      --heads 16 --d 128 --dtype bf16 $args --output "$OUT/attention-issue6-step12-h100.jsonl" --format markdown \
      2>/tmp/b.err || tail -5 /tmp/b.err
done
stamp issue6
left=$(( 585 - ($(date +%s) - start) ))
timeout $left python3 -m pytest -q -x tests/test_attention_kernels.py -k "gpu and not autotuned and not graph" 2>&1 | tail -3
stamp tests
