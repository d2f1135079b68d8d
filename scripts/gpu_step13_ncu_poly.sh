# Issue 6, step 13 (sixth session): Nsight Compute on the leaderboard shape's kernels (ours with and without
# "poly=1", and cuDNN's), then every shipped config of every kernel timed with and without "poly=1".
# The "poly" code path was taken out after this run: apply scripts/step13_poly.patch first (`git apply`).
# Run on the GPU machine from the repository root: bash scripts/gpu_step13_ncu_poly.sh (writes to $OUT).
. scripts/gpu_common.sh
"$NCU" --version | tail -1
timeout 240 "$NCU" --profile-from-start off -f -o /tmp/flash-ncu "${NCU_SECTIONS[@]}" \
    python3 scripts/flash_ncu.py --poly 0,1 > /tmp/ncu.log 2>&1 || tail -20 /tmp/ncu.log
grep -v "^==PROF==" /tmp/ncu.log | tail -3
"$NCU" --import /tmp/flash-ncu.ncu-rep --csv --page details > "$OUT/ncu-details-step13.csv"
"$NCU" --import /tmp/flash-ncu.ncu-rep --csv --page raw > "$OUT/ncu-raw-step13.csv"
cp /tmp/flash-ncu.ncu-rep "$OUT/attention-ncu-leaderboard-step13-h100.ncu-rep"
stamp ncu
timeout 330 python3 scripts/flash_tune.py --loads tma --candidates shipped --poly 0,1 --workers 14 \
    --output "$OUT/attention-flash-tune-step13-poly-h100.json" > "$OUT/tune13-poly.md" 2> /tmp/tune.err
tail -2 /tmp/tune.err; stamp sweep
