# Issue 6, step 17 (tenth session): the fused Gluon backward (flash_gluon_bwd.fused: dK, dV and dQ in one
# kernel, dQ added by TMA reductions). Its GPU tests, then the whole backward with it against the shipped Triton
# one and cuDNN's (scripts/flash_gluon_dkdv.py --no-dkdv) on the leaderboard shape. $1 tags the output files
# (one per kernel version). Run on the GPU machine from the repository root (writes to $OUT).
. scripts/gpu_common.sh
tag=${1:-run}
timeout 200 python3 -m pytest -q tests/test_attention_kernels.py tests/test_attention_gluon.py -k "gluon or fused" \
    2>&1 | tail -3
stamp "gluon tests"
timeout 380 python3 scripts/flash_gluon_dkdv.py --shapes leaderboard --no-dkdv \
    --output "$OUT/attention-gluon-fused-step17-$tag-h100.json" 2>/tmp/g.err \
    | tee "$OUT/attention-gluon-fused-step17-$tag-h100.md"; grep -v '^{' /tmp/g.err | tail -4
stamp "fused timings"
