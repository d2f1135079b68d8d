# Issue 6, step 14 (seventh session): one grid order per shape for the forward and dQ kernels. Section 1
# commands (leaderboard three times, the two d = 128 configurations), then Nsight Compute's per-instruction
# view of the dK/dV kernel on the leaderboard shape. The GPU tests run apart: `bash scripts/gpu_step14.sh tests`.
# Run on the GPU machine from the repository root (writes to $OUT).
. scripts/gpu_common.sh
if [ "${1:-}" = tests ]; then
  timeout 400 python3 -m pytest -q tests/test_attention_kernels.py tests/test_attention_launch.py 2>&1 | tail -3
  stamp tests
  exit 0
fi
for run in 1 2 3; do
  leaderboard "attention-leaderboard-step14-run$run-h100.jsonl"; stamp "leaderboard $run"
done
issue6_configs attention-issue6-step14-h100.jsonl; stamp issue6
# Warp stall samples per SASS instruction of the dK/dV kernel (the leaderboard's pinned configs).
timeout 200 "$NCU" --profile-from-start off --kernel-name regex:dkdv --launch-count 1 --section SourceCounters \
    --section WarpStateStats --import-source yes -o "$OUT/ncu-dkdv-source-step14" \
    python3 scripts/flash_ncu.py --no-cudnn > /tmp/ncu.log 2>&1 || tail -5 /tmp/ncu.log
"$NCU" -i "$OUT/ncu-dkdv-source-step14.ncu-rep" --page source --csv --print-source sass \
    > "$OUT/ncu-dkdv-source-step14-sass.csv" 2>&1; head -c 600 "$OUT/ncu-dkdv-source-step14-sass.csv"; echo
stamp ncu
