# Issue 6, step 22 (fifteenth session): a FlashAttention-3-style forward in Gluon (`flash_gluon_fwd`): two
# consumer warp groups of 64 query rows and a producer warp streaming K and V by TMA.
# `bash scripts/gpu_step22.sh` (default mode): the Gluon forward's GPU tests, then `scripts/step22/fwd_bench.py`
# (every Gluon config against the Triton forward and cuDNN's, five interleaved rounds, on the three issue 6 shapes),
# which writes each shape's fastest Gluon config to $OUT/best-<shape>.txt.
# `bash scripts/gpu_step22.sh pair [RUNS]`: each issue 6 command's fwd+bwd with the Gluon forward (the config in
# best-<shape>.txt, or DEFAULTS when none) and with the Triton forward (PROFILER_KIT_FLASH_GLUON_FWD=0), alternately,
# RUNS times (default 2).
# `bash scripts/gpu_step22.sh dkdv [RUNS]`: the two d = 128 commands with the Gluon forward (FWD, default
# 128,3,1), alternately with the Gluon dK/dV kernel (DKDV, default 64,64,2,4) and the Triton one, RUNS times.
# `bash scripts/gpu_step22.sh final`: the new GPU tests, then the section 1 commands of issue 6 (the leaderboard and
# the two d = 128 configurations) with the shipped defaults, twice.
# `bash scripts/gpu_step22.sh grid`: the eager grid's d = 128 row (step 21's command, --rounds 5).
# Run on the GPU machine from the repository root (writes to $OUT).
. scripts/gpu_common.sh
if [ "${1:-all}" = all ]; then
  timeout 240 python3 -m pytest -q tests/test_attention_kernels.py tests/test_attention_gluon.py -k "gluon" 2>&1 \
      | tail -4; stamp "gluon tests"
  timeout 330 python3 scripts/step22/fwd_bench.py --best-dir "$OUT" 2>&1 | grep -v "Warning\|warn_once" \
      | tee "$OUT/attention-gluon-fwd-step22-h100.md"; stamp "forward bench"
fi
if [ "${1:-all}" = pair ]; then
  pair_runs PROFILER_KIT_FLASH_GLUON_FWD best- gluon triton step22 "${2:-2}" ${SHAPES:-causal4096 full8192 leaderboard}
fi
if [ "${1:-all}" = dkdv ]; then
  for run in $(seq 1 "${2:-2}"); do
    for shape in causal4096 full8192; do
      for dkdv in "${DKDV:-64,64,2,4}" 0; do
        echo "== $shape, Gluon dK/dV ${dkdv/#0/off}, run $run"
        PROFILER_KIT_FLASH_GLUON_DKDV=$dkdv PROFILER_KIT_FLASH_GLUON_FWD="${FWD:-128,3,1}" shape_bench "$shape" \
            "attention-$shape-dkdv${dkdv//,/x}-run$run-step22-h100.jsonl"
      done
      stamp "$shape run $run"
    done
  done
fi
if [ "${1:-all}" = final ]; then
  timeout 200 python3 -m pytest -q tests/test_attention_kernels.py tests/test_attention_gluon.py -k "gluon" 2>&1 \
      | tail -2; stamp "gluon tests"
  section1_twice step22
fi
if [ "${1:-all}" = grid ]; then
  grid_rounds5 step22
fi
