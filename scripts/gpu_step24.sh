# Issue 6, step 24 (seventeenth session): the fused Gluon backward with 128-row query tiles at d = 64, on the
# leaderboard shape. The modes are gpu_step23.sh's, on the leaderboard alone and with step24 file names:
# `bash scripts/gpu_step24.sh` (GPU tests of every fused config, then bwd_bench.py), `… pair [RUNS]`, `… final`.
# Run on the GPU machine from the repository root (writes to $OUT).
STEP=step24 SHAPES=${SHAPES:-leaderboard} PAIR_SHAPES=${PAIR_SHAPES:-leaderboard} exec bash scripts/gpu_step23.sh "$@"
