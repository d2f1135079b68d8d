# What the GPU scripts of issue 6 share (from step 13 on). Source it from the repository root on the GPU
# machine: `. scripts/gpu_common.sh`. It sets up the carried tools (.gpu/), puts the checkout on PYTHONPATH,
# and defines `stamp`, the Nsight Compute binary and sections, `shape_bench` (one issue 6 shape) and the section 1 commands of
# docs/results/attention-h100.md as functions writing into $OUT (BENCH_ARGS adds options to them, e.g.
# BENCH_ARGS="--rounds 5").
set -uo pipefail
. .gpu/setup.sh >/dev/null
export PYTHONPATH=$PWD:${PYTHONPATH:-}
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $1"; }
NCU=$(ls -d /opt/nvidia/nsight-compute/*/ncu | sort | tail -n 1)
NCU_SECTIONS=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats
              --section SchedulerStats --section Occupancy --section LaunchStats --section InstructionStats)

leaderboard() {  # $1: the .jsonl file name under $OUT
  timeout 110 python3 -m profiler_kit attention leaderboard ${BENCH_ARGS:-} --output "$OUT/$1" --format markdown \
      2>/tmp/lb.err \
      | grep "flash-triton\|sdpa-cudnn" || tail -5 /tmp/lb.err
}

issue6_configs() {  # $1: the .jsonl file name under $OUT; the two d = 128 configurations of issue 6
  for args in "--seq 4096 --causal" "--seq 8192 --no-causal"; do
    timeout 80 python3 -m profiler_kit attention bench --impl flash-triton,sdpa-cudnn,sdpa-flash --batch 4 \
        --heads 16 --d 128 --dtype bf16 $args ${BENCH_ARGS:-} --output "$OUT/$1" --format markdown 2>/tmp/b.err \
        | grep "flash-triton\|sdpa-cudnn" || tail -5 /tmp/b.err
  done
}

shape_bench() {  # $1: an issue 6 shape (causal4096, full8192, leaderboard), $2: the .jsonl file under $OUT; the
  # caller sets the PROFILER_KIT_FLASH_* switches for the call, e.g. `PROFILER_KIT_FLASH_GLUON_FWD=0 shape_bench …`
  case $1 in
    causal4096) args=(attention bench --impl flash-triton,sdpa-cudnn --batch 4 --heads 16 --d 128 --seq 4096 --causal);;
    full8192) args=(attention bench --impl flash-triton,sdpa-cudnn --batch 4 --heads 16 --d 128 --seq 8192 --no-causal);;
    leaderboard) args=(attention leaderboard);;
  esac
  timeout 120 python3 -m profiler_kit "${args[@]}" --dtype bf16 --output "$OUT/$2" --format markdown 2>/tmp/b.err \
      | grep "flash-triton\|sdpa-cudnn" || tail -5 /tmp/b.err
}

pair_runs() {  # $1: a PROFILER_KIT_FLASH_* switch, $2: the prefix of its best-config files under BEST_DIR (default
  # $OUT), $3 and $4: names of its two sides in file names, $5: the step's tag, $6: runs, the rest: issue 6 shapes.
  # Each shape's command with the switch at the shape's best config (the shipped default, an empty switch, without
  # the file) and at 0, alternately, $6 times.
  local switch=$1 prefix=$2 on=$3 off=$4 tag=$5 runs=$6 run shape best
  shift 6
  for run in $(seq 1 "$runs"); do
    for shape in "$@"; do
      best=$(cat "${BEST_DIR:-$OUT}/$prefix$shape.txt" 2>/dev/null || echo "")
      echo "== $shape, $on ${best:-(default)}, run $run"
      (export "$switch=$best"; shape_bench "$shape" "attention-$shape-$on-run$run-$tag-h100.jsonl")
      echo "== $shape, $off, run $run"
      (export "$switch=0"; shape_bench "$shape" "attention-$shape-$off-run$run-$tag-h100.jsonl")
      stamp "$shape run $run"
    done
  done
}

section1_twice() {  # $1: the step's tag in file names (e.g. step23): the leaderboard and issue 6 commands, twice
  for run in 1 2; do
    leaderboard "attention-leaderboard-run$run-$1-h100.jsonl"; stamp "leaderboard, run $run"
    issue6_configs "attention-issue6-run$run-$1-h100.jsonl"; stamp "issue 6 configurations, run $run"
  done
}

grid_rounds5() {  # $1: the step's tag in file names, $2: head dims (default 128, the d = 128 row; 16,32,64,128 the
  # whole bf16 grid): the eager grid (step 21's command, --rounds 5) and its ratios
  local dims=${2:-128}
  local file="$OUT/attention-grid-d${dims//,/-}-rounds5-$1-h100.jsonl"
  PROFILER_KIT_FLASH_CPP=1 timeout 500 python3 -m profiler_kit attention bench --impl flash-triton,sdpa-flash \
      --batch 8 --d "$dims" --seq 256,1024,4096,8192,16384 --dtype bf16 --rounds 5 --output "$file" --format csv \
      >/dev/null 2>/tmp/g.err
  grep -v "Warning\|warn_once\|loading the C++\|━" /tmp/g.err | tail -3
  python3 scripts/step21/ratio_grid.py "$file"; stamp "grid d=$dims"
}
