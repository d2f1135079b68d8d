# Issue 6, step 18 (eleventh session): variants of the Gluon backward kernels, built under .gpu/s18/ from
# scripts/step18/*.patch (scripts/step18/make_variants.sh), timed beside the committed kernels:
# - the fused kernel with dQ's shared-memory tile double-buffered, and "lean" fused schedules (nothing deferred
#   to the next tile; "_r168": registers capped so that three 4-warp blocks share an SM), by
#   scripts/flash_fused_sink.py --module;
# - the dK/dV kernel warp-specialised (two consumer warp groups on a 128-key tile, one loader warp; "_pp" adds
#   ping-pong turns), by scripts/step18/run_ws.py;
# - `bash scripts/gpu_step18.sh clock`: only the SM clock and power during back-to-back backwards
#   (scripts/step18/clock_loop.py), Triton's dK/dV kernel against the warp-specialised one.
# Run on the GPU machine from the repository root (writes to $OUT).
. scripts/gpu_common.sh
[ -d .gpu/s18 ] || bash scripts/step18/make_variants.sh
if [ "${1:-all}" = clock ]; then
  timeout 200 python3 scripts/step18/clock_loop.py 2>/tmp/c.err | tee "$OUT/attention-clock-ws-step18-h100.md"
  grep -v "Warning\|warn_once" /tmp/c.err | tail -4
  stamp "clock"; exit 0
fi
V=.gpu/s18
python3 scripts/step18/occupancy.py $V/fused_db.py:3 $V/fused_lean.py:2 $V/fused_lean2a.py:2 \
    $V/fused_lean2a_r168.py:2 $V/fused_lean2b_r168.py:2 $V/fused_lean_r168.py:2 2>&1 | grep -v Warning | tail -8
stamp "occupancy"
if [ "${1:-all}" != ws ]; then
  timeout 250 python3 scripts/flash_fused_sink.py --config 64,64,3,4 --module $V/fused_db.py \
      --output "$OUT/attention-fused-sink-step18-s3-h100.json" 2>/tmp/s.err \
      | tee "$OUT/attention-fused-sink-step18-s3-h100.md"; grep -v '^{' /tmp/s.err | tail -4
  stamp "3 stages"
  timeout 300 python3 scripts/flash_fused_sink.py --config 64,64,2,4 --module $V/fused_lean.py \
      --module $V/fused_lean2a.py --module $V/fused_lean2a_r168.py --module $V/fused_lean2b_r168.py \
      --module $V/fused_lean_r168.py --output "$OUT/attention-fused-sink-step18-s2-h100.json" 2>/tmp/s.err \
      | tee "$OUT/attention-fused-sink-step18-s2-h100.md"; grep -v '^{' /tmp/s.err | tail -4
  stamp "2 stages"
fi
timeout 400 python3 scripts/step18/run_ws.py --output "$OUT/attention-dkdv-ws-step18-h100.json" 2>/tmp/w.err \
    | tee "$OUT/attention-dkdv-ws-step18-h100.md"; grep -v "Warning\|warn_once" /tmp/w.err | tail -4
stamp "warp-specialised dK/dV"
