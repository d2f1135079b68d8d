# Issue 6, step 23 (sixteenth session): the backward in one Gluon kernel, two consumer warp groups sharing a
# 128-key block and splitting dQ by columns (`flash_gluon_fused`).
# `bash scripts/gpu_step23.sh` (default mode): its GPU tests, then `scripts/step23/bwd_bench.py` (every offered config
# against the split Triton backward and cuDNN's, five interleaved rounds, on the three issue 6 shapes), which writes
# each shape's fastest config to $OUT/bwd-best-<shape>.txt.
# `bash scripts/gpu_step23.sh pair [RUNS]`: each issue 6 command's fwd+bwd with the fused backward (the config in
# bwd-best-<shape>.txt under BEST_DIR, default $OUT; the shipped default without it) and with the split one,
# alternately, RUNS times (default 2).
# `bash scripts/gpu_step23.sh tests`: the GPU and Gluon tests of the attention kernels (~2.5 minutes once warm).
# `bash scripts/gpu_step23.sh final`: the section 1 commands of issue 6 (the leaderboard and the two d = 128
# configurations) with the shipped defaults, twice.
# `bash scripts/gpu_step23.sh grid`: the eager grid's d = 128 row (step 21's command, --rounds 5); GRID_D=16,32,64,128
# for the whole bf16 grid.
# STEP (default step23) tags the file names, SHAPES and PAIR_SHAPES narrow the shapes (scripts/gpu_step24.sh).
# Run on the GPU machine from the repository root (writes to $OUT).
. scripts/gpu_common.sh
if [ "${1:-all}" = all ]; then
  timeout 240 python3 -m pytest -q tests/test_attention_kernels.py -k "two_group" 2>&1 | tail -4; stamp "tests"
  timeout 330 python3 scripts/step23/bwd_bench.py --shapes "${SHAPES:-causal4096,full8192,leaderboard}" \
      --best-dir "$OUT" 2>&1 | grep -v "Warning\|warn_once" | tee "$OUT/attention-gluon-bwd-${STEP:-step23}-h100.md"
  stamp "backward bench"
fi
if [ "${1:-all}" = pair ]; then
  pair_runs PROFILER_KIT_FLASH_GLUON_BWD bwd-best- fused split "${STEP:-step23}" "${2:-2}" \
      ${PAIR_SHAPES:-causal4096 full8192 leaderboard}
fi
if [ "${1:-all}" = tests ]; then
  timeout 560 python3 -m pytest -q tests/test_attention_kernels.py tests/test_attention_gluon.py \
      tests/test_attention_cpp.py -k "gpu or gluon" 2>&1 | tail -2; stamp "GPU and Gluon tests"
fi
if [ "${1:-all}" = final ]; then
  section1_twice "${STEP:-step23}"
fi
if [ "${1:-all}" = grid ]; then
  grid_rounds5 "${STEP:-step23}" "${GRID_D:-128}"
fi
