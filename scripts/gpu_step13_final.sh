# Issue 6, step 13 (sixth session): the final kernels through the section 1 commands (leaderboard twice, the
# two d = 128 configurations) and the GPU tests of the Triton kernels.
# Run on the GPU machine from the repository root: bash scripts/gpu_step13_final.sh (writes to $OUT).
. scripts/gpu_common.sh
for run in 1 2; do
  leaderboard "attention-leaderboard-step13-final-run$run-h100.jsonl"; stamp "leaderboard $run"
done
issue6_configs attention-issue6-step13-final-h100.jsonl; stamp issue6
timeout 330 python3 -m pytest -q tests/test_attention_kernels.py tests/test_attention_launch.py 2>&1 | tail -3
stamp tests
