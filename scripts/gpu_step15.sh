# Issue 6, step 15 (eighth session): the C++ host path (profiler_kit/attention/flash_cpp.py). Builds the
# extension, runs its GPU tests, then host time per call with and without it. `bash scripts/gpu_step15.sh grid`
# runs the eager grid against SDPA's FA2 backend with it (the step 5 command, PROFILER_KIT_FLASH_CPP=1);
# `... tests` the other attention GPU tests. Run on the GPU machine from the repository root
# (writes to $OUT).
. scripts/gpu_common.sh
if [ "${1:-}" = tests ]; then  # the other attention GPU tests, on the Python path
  PROFILER_KIT_FLASH_CPP=0 timeout 330 python3 -m pytest -q tests/test_attention_kernels.py \
      tests/test_attention_launch.py 2>&1 | tail -3
  stamp tests
  exit 0
fi
export PROFILER_KIT_FLASH_CPP=1
python3 -c "from profiler_kit.attention import flash_cpp; assert flash_cpp.extension() is not None" 2>&1 | tail -30
stamp build
grid() {  # the step 5 grid, flash-triton beside SDPA's FA2 backend, into $OUT/$1
  timeout "$2" python3 -m profiler_kit attention bench --impl flash-triton,sdpa-flash --batch 8 --d 16,32,64,128 \
      --seq 256,1024,4096,8192,16384 --dtype bf16 --output "$OUT/$1" --resume --format markdown \
      > "$OUT/${1%.jsonl}.md" 2>/tmp/grid.err; tail -2 /tmp/grid.err
}
if [ "${1:-}" = grid ]; then
  grid attention-grid-fa2-step15-h100.jsonl 500; stamp grid
  exit 0
fi
timeout 150 python3 -m pytest -q tests/test_attention_cpp.py 2>&1 | tail -3
stamp "cpp tests"
python3 scripts/flash_host_time.py | tee "$OUT/attention-host-time-step15-h100.txt"
python3 scripts/flash_host_time.py --seq 4096 --heads 16 --batch 1 | tee -a "$OUT/attention-host-time-step15-h100.txt"
stamp "host time"
