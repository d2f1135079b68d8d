# Issue 6, step 16 (ninth session): the Gluon dK/dV kernel (profiler_kit/attention/flash_gluon_bwd.py). Its GPU
# tests, then the whole backward with it against the shipped Triton one (scripts/flash_gluon_dkdv.py) on the
# shapes named by $1 (default: the leaderboard). Run on the GPU machine from the repository root (writes to $OUT).
. scripts/gpu_common.sh
timeout 200 python3 -m pytest -q tests/test_attention_kernels.py -k gluon 2>&1 | tail -15
stamp "gluon tests"
shapes=${1:-leaderboard}
timeout 380 python3 scripts/flash_gluon_dkdv.py --shapes "$shapes" --output "$OUT/attention-gluon-dkdv-step16-${shapes//,/-}-h100.json" \
    2>/tmp/g.err | tee "$OUT/attention-gluon-dkdv-step16-${shapes//,/-}-h100.md"; tail -4 /tmp/g.err
stamp "gluon timings"
