# Issue 6, step 11 (fourth session): SM clock and power while each implementation runs the leaderboard
# config back to back (attention bench with --rep 2000, i.e. ~2 s per measurement), sampled by nvidia-smi
# every 50 ms. Run on the GPU machine from the repository root: bash scripts/gpu_step11_clocks.sh.
set -uo pipefail
. .gpu/setup.sh >/dev/null
export PYTHONPATH=$PWD:${PYTHONPATH:-}
for impl in flash-triton sdpa-cudnn flash-triton sdpa-cudnn; do
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
      --format=csv,noheader,nounits -lms 50 > "$OUT/clocks-$impl.csv" &
  smi=$!
  timeout 120 python3 -m profiler_kit attention bench --impl $impl --batch 1 --heads 16 --d 64 --seq 16384 \
      --dtype bf16 --causal --rep 2000 --format csv 2>/dev/null | cut -d, -f1,9,10,13,16
  kill $smi; wait $smi 2>/dev/null
  # keep the samples taken while the GPU drew over 300 W, i.e. while the kernels ran
  awk -F', ' -v impl=$impl '$3 > 300 {n++; c+=$2; p+=$3; t=$4} END {printf "%s: %d busy samples, mean SM clock %.0f MHz, mean power %.0f W, last temp %s C\n", impl, n, c/n, p/n, t}' "$OUT/clocks-$impl.csv"
done
