# Issue 6, step 13 (sixth session): the dK/dV kernel with LSE2 and Delta loaded by TMA, against the committed
# kernel, in one machine session. Needs the committed tree of profiler_kit/ and scripts/ in .base/ (made with
# `git archive HEAD profiler_kit scripts | tar -x -C .base` before the change, and carried).
# Run on the GPU machine from the repository root: bash scripts/gpu_step13_lse_tma.sh (writes to $OUT).
. scripts/gpu_common.sh
sweep() {  # $1: tree, $2: output name
  (cd "$1" && PYTHONPATH=$PWD:$PYTHONPATH timeout 200 python3 scripts/flash_tune.py --loads tma --overlap both \
      --kernels dkdv --workers 14 --output "$OUT/$2.json" > "$OUT/$2.md" 2> /tmp/tune.err; tail -1 /tmp/tune.err)
}
sweep .base attention-flash-tune-step13-dkdv-before-h100; stamp "sweep before"
sweep . attention-flash-tune-step13-dkdv-after-h100; stamp "sweep after"
timeout 120 "$NCU" --profile-from-start off -f -o /tmp/flash-ncu2 -k regex:dkdv "${NCU_SECTIONS[@]}" \
    python3 scripts/flash_ncu.py --no-cudnn > /tmp/ncu.log 2>&1 || tail -5 /tmp/ncu.log
"$NCU" --import /tmp/flash-ncu2.ncu-rep --csv --page raw > "$OUT/ncu-raw-step13-dkdv-tma.csv"; stamp ncu
leaderboard attention-leaderboard-step13-h100.jsonl; stamp leaderboard
issue6_configs attention-issue6-step13-h100.jsonl; stamp issue6
