# Issue 6, step 13 (sixth session): the dK/dV kernel with LSE2 and Delta loaded by TMA, against the committed
# kernel, in one machine session. Needs the committed tree of profiler_kit/ and scripts/ in .base/ (made with
# `git archive HEAD profiler_kit scripts | tar -x -C .base` before the change, and carried).
# Run on the GPU machine from the repository root: bash scripts/gpu_step13_lse_tma.sh (writes to $OUT).
set -uo pipefail
. .gpu/setup.sh >/dev/null
export PYTHONPATH=$PWD:${PYTHONPATH:-}
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $1"; }
sweep() {  # $1: tree, $2: output name
  (cd "$1" && PYTHONPATH=$PWD:$PYTHONPATH timeout 200 python3 scripts/flash_tune.py --loads tma --overlap both \
      --kernels dkdv --workers 14 --output "$OUT/$2.json" > "$OUT/$2.md" 2> /tmp/tune.err; tail -1 /tmp/tune.err)
}
sweep .base attention-flash-tune-step13-dkdv-before-h100; stamp "sweep before"
sweep . attention-flash-tune-step13-dkdv-after-h100; stamp "sweep after"
NCU=$(ls -d /opt/nvidia/nsight-compute/*/ncu | sort | tail -n 1)
timeout 120 "$NCU" --profile-from-start off -f -o /tmp/flash-ncu2 -k regex:dkdv --section SpeedOfLight \
    --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy \
    --section LaunchStats --section InstructionStats python3 scripts/flash_ncu.py --no-cudnn > /tmp/ncu.log 2>&1 \
    || tail -5 /tmp/ncu.log
"$NCU" --import /tmp/flash-ncu2.ncu-rep --csv --page raw > "$OUT/ncu-raw-step13-dkdv-tma.csv"; stamp ncu
timeout 110 python3 -m profiler_kit attention leaderboard --output "$OUT/attention-leaderboard-step13-h100.jsonl" \
    --format markdown 2>/tmp/lb.err || tail -5 /tmp/lb.err
stamp leaderboard
for args in "--seq 4096 --causal" "--seq 8192 --no-causal"; do
  timeout 80 python3 -m profiler_kit attention bench --impl flash-triton,sdpa-cudnn,sdpa-flash --batch 4 \
      --heads 16 --d 128 --dtype bf16 $args --output "$OUT/attention-issue6-step13-h100.jsonl" --format markdown \
      2>/tmp/b.err | grep -A6 "^### timings" || tail -5 /tmp/b.err
done
stamp issue6
