# Issue 6, step 12 (fifth session): where the fused backward's extra time goes. Times the fused kernel of
# commit 55a7fa7 with its dQ tile sent four ways (PK_DQ_SINK): 0 tl.atomic_add (scalar atomics), 1 red.v2
# (as committed), 2 a plain store (same addresses, no read-modify-write), 3 nothing (the dQ matmul is then
# dead code and compiled away).
# Prepare on the CPU machine from the repository root:
#   rm -rf .gpu/exp && mkdir -p .gpu/exp && git archive 55a7fa7 profiler_kit scripts | tar -x -C .gpu/exp
#   (cd .gpu/exp && patch -p1 < ../../scripts/step12_dq_sink.patch)
# then run on the GPU machine (carrying .gpu): bash scripts/gpu_step12_dq_sink.sh (writes to $OUT).
set -uo pipefail
. .gpu/setup.sh >/dev/null
export PYTHONPATH=$PWD/.gpu/exp:${PYTHONPATH:-}
start=$(date +%s)
for sink in 1 0 2 3; do
  PK_DQ_SINK=$sink timeout 140 python3 .gpu/exp/scripts/flash_tune.py --shapes leaderboard,full8192 --loads tma \
      --overlap on --kernels fused --workers 14 --output "$OUT/dq-sink-$sink.json" > "$OUT/dq-sink-$sink.md" \
      2> /tmp/sink.err || tail -3 /tmp/sink.err
  echo "[$(( $(date +%s) - start ))s] sink $sink"
done
