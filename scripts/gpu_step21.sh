# Issue 6, step 21 (fourteenth session): `attention bench --rounds`, the implementations of a shape timed in
# interleaved rounds. Step 20 found that one reading of a host-bound shape moves by up to 2× from one tenth of a
# second to the next, so the eager grid lost a different few shapes in each run.
# `bash scripts/gpu_step21.sh` (default mode): the bench's GPU tests, then the eager grid (batch 8, no heads, causal,
# bf16, d 16–128, N in SEQS, flash-triton against SDPA's FlashAttention-2 backend, C++ host path), alternately with
# one reading (--rounds 1) and with five interleaved rounds (--rounds 5), once for each run named in RUNS (default
# "1 2"). The first call ran only N 256, 1024 and 4096, into attention-grid-host-rounds{1,5}-run{1,2}-step21-h100.jsonl
# (commit 4fa891b); `TESTS=0 RUNS="3 4 5" bash scripts/gpu_step21.sh` ran the whole grid without the tests.
# `bash scripts/gpu_step21.sh grid D[,D...] [SECONDS]`: the whole eager grid with --rounds 5 for those head dims,
# resuming docs/results/data/attention-grid-fa2-rounds5-step21-h100.jsonl where an earlier call left it.
# `bash scripts/gpu_step21.sh final`: the leaderboard and the two d = 128 configurations of issue 6, alternately
# with one reading and with five rounds, twice each.
# Run on the GPU machine from the repository root (writes to $OUT).
. scripts/gpu_common.sh
grid_runs() {  # $1: the number of rounds, $2: the .jsonl file name under $OUT, $3: head dims, $4: lengths
  PROFILER_KIT_FLASH_CPP=1 timeout "${5:-300}" python3 -m profiler_kit attention bench \
      --impl flash-triton,sdpa-flash --batch 8 --d "$3" --seq "$4" --dtype bf16 --rounds "$1" --resume \
      --output "$OUT/$2" --format csv >/dev/null 2>/tmp/g.err
  grep -v "Warning\|warn_once\|loading the C++\|━" /tmp/g.err | tail -3
  python3 scripts/step21/ratio_grid.py "$OUT/$2"
}
if [ "${1:-all}" = all ]; then
  if [ "${TESTS:-1}" = 1 ]; then
    timeout 200 python3 -m pytest -q tests/test_attention_bench.py -k gpu 2>&1 | tail -3; stamp "bench tests"
  fi
  for run in ${RUNS:-1 2}; do
    for r in 1 5; do
      grid_runs $r "attention-grid-rounds$r-run$run-step21-h100.jsonl" 16,32,64,128 \
          "${SEQS:-256,1024,4096,8192,16384}" 120
      stamp "rounds $r, run $run"
    done
  done
fi
if [ "${1:-all}" = grid ]; then
  grid=attention-grid-fa2-rounds5-step21-h100.jsonl
  if [ -f "docs/results/data/$grid" ]; then cp "docs/results/data/$grid" "$OUT/$grid"; fi
  grid_runs 5 "$grid" "$2" 256,1024,4096,8192,16384 "${3:-500}"; stamp "grid d=$2"
fi
if [ "${1:-all}" = final ]; then
  for run in 1 2; do
    for r in 1 5; do
      BENCH_ARGS="--rounds $r" leaderboard "attention-leaderboard-rounds$r-run$run-step21-h100.jsonl"
      stamp "leaderboard, rounds $r, run $run"
      BENCH_ARGS="--rounds $r" issue6_configs "attention-issue6-rounds$r-run$run-step21-h100.jsonl"
      stamp "issue 6 configurations, rounds $r, run $run"
    done
  done
fi
