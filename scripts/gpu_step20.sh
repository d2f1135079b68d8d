# Issue 6, step 20 (thirteenth session): the d = 128 forward+backward and the host.
# Every issue 6 run so far timed our causal N = 4096 forward+backward 0.03–0.16 ms slower than its forward and
# backward timed apart (cuDNN's within ±0.06 of its sum). The forward there takes 0.58 ms of GPU time, about
# what the Python path's backward spends on the host before its first launch.
# `bash scripts/gpu_step20.sh` (default mode):
# - the GPU timeline of that shape (scripts/flash_timeline.py) on the Python host path and the C++ one;
# - the two d = 128 configurations of issue 6 (section 1 command) once on the Python path and twice with
#   PROFILER_KIT_FLASH_CPP=1;
# - then, on a patched copy of the kernels (scripts/step20/dkdv_regs_k.patch: only K as a register operand in
#   the dK/dV kernel, offered at d = 128 too), the dK/dV kernel's shipped configs with and without "regs" on
#   the d = 128 shapes.
# `bash scripts/gpu_step20.sh host`: the four host-bound shapes the eager grid lost in step 15 (batch 8, no heads,
# causal, d 16 and 64, N 256 and 4096), on the C++ host path: the timeline back to back and one at a time
# (scripts/flash_timeline.py), the host time per call (scripts/flash_host_time.py) and `attention bench`.
# `bash scripts/gpu_step20.sh rounds`: those shapes' forward+backward timed as the bench times it, in alternating
# rounds, with Python's garbage collector on and off (scripts/step20/host_rounds.py).
# `bash scripts/gpu_step20.sh group`: causal launches take their heads in groups of CAUSAL_HEAD_GROUP (4) instead
# of one after another (`flash_triton_fwd.grid_position`). The two d = 128 configurations of issue 6 alternately
# with groups of 4 and of 1 (the old order, by editing the constant), twice each; then the shipped configs of the
# three kernels on the causal N = 4096 shape with each (scripts/flash_tune.py). `RUNS= SIZES="2 8" bash
# scripts/gpu_step20.sh group` runs only the sweep, with groups of 2 and 8.
# `bash scripts/gpu_step20.sh final`: the leaderboard three times and the d = 128 configurations twice.
# `bash scripts/gpu_step20.sh tests`: the GPU tests of the attention kernels.
# `bash scripts/gpu_step20.sh grid D[,D...] [SECONDS]`: the eager grid of step 15 (batch 8, no heads, causal, bf16,
# flash-triton against SDPA's FlashAttention-2 backend, C++ host path) for those head dims, resuming
# docs/results/data/attention-grid-fa2-step20-h100.jsonl where an earlier call left it.
# Run on the GPU machine from the repository root (writes to $OUT).
. scripts/gpu_common.sh
timeline_d128() {  # $1: the .txt file name under $OUT; the environment picks the host path
  timeout 150 python3 scripts/flash_timeline.py --batch 4 --seq 4096 --d 128 2>/tmp/tl.err > "$OUT/$1"
  grep "calls; span" "$OUT/$1"; grep -i "error" /tmp/tl.err | tail -3
}
if [ "${1:-all}" = all ]; then
  timeline_d128 "attention-timeline-d128-step20-python-h100.txt"; stamp "timeline, Python path"
  PROFILER_KIT_FLASH_CPP=1 timeline_d128 "attention-timeline-d128-step20-cpp-h100.txt"; stamp "timeline, C++ path"
  issue6_configs "attention-issue6-step20-python-h100.jsonl"; stamp "issue 6 configurations, Python path"
  for run in 1 2; do
    PROFILER_KIT_FLASH_CPP=1 issue6_configs "attention-issue6-step20-cpp-run$run-h100.jsonl"
    stamp "issue 6 configurations, C++ path, run $run"
  done
  patch --quiet -p1 < scripts/step20/dkdv_regs_k.patch
  timeout 200 python3 scripts/flash_tune.py --candidates shipped --loads tma --regs both --kernels dkdv \
      --shapes causal4096,full8192 --workers 14 > "$OUT/attention-tune-dkdv-regs-k-step20-h100.md" 2>/tmp/t.err
  awk '/^## /{print; n=0} /^\| dkdv/{if (n++ < 6) print}' "$OUT/attention-tune-dkdv-regs-k-step20-h100.md"
  grep -v '^{' /tmp/t.err | grep -v "Warning\|warn_once" | tail -3
  stamp "dK/dV sweep with K in registers"
fi
if [ "${1:-all}" = host ]; then
  export PROFILER_KIT_FLASH_CPP=1
  for shape in "16 4096" "64 4096" "16 256" "64 256"; do
    set -- $shape
    for mode in --back-to-back ""; do
      name="attention-timeline-grid-d$1-n$2${mode:+-b2b}-step20-h100.txt"
      timeout 100 python3 scripts/flash_timeline.py --impl flash-triton,sdpa-flash --batch 8 --heads 0 --d $1 \
          --seq $2 --iterations 30 $mode 2>/tmp/tl.err > "$OUT/$name"
      echo "$name"; grep "calls; span" "$OUT/$name"; grep -i "error" /tmp/tl.err | tail -3
    done
    stamp "timelines d=$1 N=$2"
  done
  timeout 120 python3 scripts/flash_host_time.py --batch 8 --seq 4096 --d 16 2>&1 \
      | tee "$OUT/attention-host-time-d16-n4096-step20-h100.txt" | tail -12
  stamp "host time"
  timeout 200 python3 -m profiler_kit attention bench --impl flash-triton,sdpa-flash --batch 8 --d 16,64 \
      --seq 256,4096 --dtype bf16 --output "$OUT/attention-grid-host-bound-step20-h100.jsonl" --format markdown \
      2>/tmp/b.err | grep "flash-triton\|sdpa-flash" | head -8
  tail -3 /tmp/b.err; stamp "bench"
fi
if [ "${1:-all}" = rounds ]; then
  PROFILER_KIT_FLASH_CPP=1 timeout 400 python3 scripts/step20/host_rounds.py 2>/tmp/r.err \
      | tee "$OUT/attention-host-rounds-step20-h100.txt"
  grep -v "Warning\|warn_once\|loading the C++" /tmp/r.err | tail -3; stamp "rounds"
fi
group_size() { sed -i "s/^CAUSAL_HEAD_GROUP = .*/CAUSAL_HEAD_GROUP = $1/" profiler_kit/attention/flash_triton_launch.py; }
if [ "${1:-all}" = group ]; then
  for run in ${RUNS-1 2}; do
    for g in 4 1; do
      group_size $g; issue6_configs "attention-issue6-step20-group$g-run$run-h100.jsonl"; stamp "group $g, run $run"
    done
  done
  for g in ${SIZES-4 1}; do
    group_size $g
    timeout 120 python3 scripts/flash_tune.py --candidates shipped --loads tma --shapes causal4096 --workers 14 \
        > "$OUT/attention-tune-causal4096-group$g-step20-h100.md" 2>/tmp/t.err
    awk '/^\| (fwd|dkdv|dq) /{k=$2; if (n[k]++ < 3) print}' "$OUT/attention-tune-causal4096-group$g-step20-h100.md"
    stamp "sweep, group $g"
  done
  group_size 4
fi
if [ "${1:-all}" = final ]; then
  for run in 1 2 3; do leaderboard "attention-leaderboard-step20-run$run-h100.jsonl"; stamp "leaderboard $run"; done
  for run in 1 2; do issue6_configs "attention-issue6-step20-final-run$run-h100.jsonl"; stamp "issue 6 configurations $run"; done
fi
if [ "${1:-all}" = tests ]; then
  timeout 330 python3 -m pytest -q tests/test_attention_kernels.py tests/test_attention_cpp.py -k gpu 2>&1 | tail -4
  stamp "tests"
fi
if [ "${1:-all}" = grid ]; then
  grid=attention-grid-fa2-step20-h100.jsonl
  if [ -f "docs/results/data/$grid" ]; then cp "docs/results/data/$grid" "$OUT/$grid"; fi
  PROFILER_KIT_FLASH_CPP=1 timeout "${3:-500}" python3 -m profiler_kit attention bench --impl flash-triton,sdpa-flash \
      --batch 8 --d "$2" --seq 256,1024,4096,8192,16384 --dtype bf16 --resume --output "$OUT/$grid" \
      --format markdown 2>/tmp/g.err | grep -v "^| seq" | tail -24
  grep -v "Warning\|warn_once\|loading the C++" /tmp/g.err | tail -3; stamp "grid d=$2"
fi
