# Issue 6, step 19 (twelfth session): the resident tiles as the matmuls' first operand from registers instead of
# shared memory (wgmma "RS" instead of "SS"):
# - in Triton, the "regs" config flag (`flash_triton_fwd.register_operand`), every shipped config of the three
#   kernels with and without it, on the three issue 6 shapes (scripts/flash_tune.py --regs both);
# - in Gluon, the dK/dV kernel with K and V loaded into registers once (scripts/step19/dkdv_regs.patch, built
#   under .gpu/s19/), checked and timed by scripts/step18/run_ws.py.
# `bash scripts/gpu_step19.sh confirm`, after the regs configs joined the dK/dV list: the GPU tests of the
# attention kernels, the leaderboard twice, and run_ws.py again (its "triton" row is then the autotuned one).
# `bash scripts/gpu_step19.sh host`: the leaderboard's GPU timeline (scripts/flash_timeline.py) on the Python
# host path and on the C++ one (PROFILER_KIT_FLASH_CPP=1), then the leaderboard twice on the C++ path.
# `bash scripts/gpu_step19.sh clock`: SM clock and power while our forward+backward and cuDNN's run back to back
# (scripts/step18/clock_loop.py --impl), then the forward's shipped configs with and without "regs", twice.
# `bash scripts/gpu_step19.sh dq`: the dQ kernel's sweep candidates on the head-first grid, with and without "regs".
# `bash scripts/gpu_step19.sh final`: the section 1 commands on the committed config lists (leaderboard three
# times, the two d = 128 configurations), then the clock loop again.
# `bash scripts/gpu_step19.sh tests`: the GPU tests of the attention kernels.
# Run on the GPU machine from the repository root (writes to $OUT).
. scripts/gpu_common.sh
mkdir -p .gpu/s19
cp profiler_kit/attention/flash_gluon_bwd.py .gpu/s19/dkdv_regs.py
patch --quiet .gpu/s19/dkdv_regs.py < scripts/step19/dkdv_regs.patch
clock_fwd_bwd() {  # $1: the .md file name under $OUT
  PROFILER_KIT_FLASH_CPP=1 timeout 120 python3 scripts/step18/clock_loop.py --impl flash-triton,sdpa-cudnn \
      2>/tmp/c.err | tee "$OUT/$1"; grep -i "error" /tmp/c.err | tail -3
}
gluon_regs() {  # $1: the file name under $OUT, without .json or .md; $2: the timeout in s (200)
  timeout "${2:-200}" python3 scripts/step18/run_ws.py --variant regs=.gpu/s19/dkdv_regs.py \
      --output "$OUT/$1.json" 2>/tmp/w.err | tee "$OUT/$1.md"
  grep -v "Warning\|warn_once" /tmp/w.err | tail -4
}
if [ "${1:-all}" = host ]; then
  timeout 150 python3 scripts/flash_timeline.py 2>/tmp/tl.err > "$OUT/attention-timeline-step19-python-h100.txt"
  tail -4 "$OUT/attention-timeline-step19-python-h100.txt"; grep -i "error" /tmp/tl.err | tail -3
  stamp "timeline, Python path"
  PROFILER_KIT_FLASH_CPP=1 timeout 200 python3 scripts/flash_timeline.py 2>/tmp/tl.err \
      > "$OUT/attention-timeline-step19-cpp-h100.txt"
  tail -4 "$OUT/attention-timeline-step19-cpp-h100.txt"; grep -i "error" /tmp/tl.err | tail -3
  stamp "timeline, C++ path"
  for run in 1 2; do
    PROFILER_KIT_FLASH_CPP=1 leaderboard "attention-leaderboard-step19-cpp-run$run-h100.jsonl"; stamp "leaderboard $run"
  done
  exit 0
fi
if [ "${1:-all}" = clock ]; then
  clock_fwd_bwd "attention-clock-fwd-bwd-step19-h100.md"; stamp "clock"
  for run in 1 2; do
    timeout 150 python3 scripts/flash_tune.py --candidates shipped --loads tma --regs both --kernels fwd \
        --shapes leaderboard --workers 14 2>/dev/null > "$OUT/attention-tune-fwd-regs-step19-run$run-h100.md"
    grep "| fwd" "$OUT/attention-tune-fwd-regs-step19-run$run-h100.md" | head -4; stamp "forward sweep $run"
  done
  exit 0
fi
if [ "${1:-all}" = final ]; then
  for run in 1 2 3; do leaderboard "attention-leaderboard-step19-final-run$run-h100.jsonl"; stamp "leaderboard $run"; done
  issue6_configs "attention-issue6-step19-h100.jsonl"; stamp "issue 6 configurations"
  clock_fwd_bwd "attention-clock-fwd-bwd-step19-final-h100.md"; stamp "clock"; exit 0
fi
if [ "${1:-all}" = dq ]; then
  timeout 200 python3 scripts/flash_tune.py --loads tma --orders head --regs both --kernels dq --shapes leaderboard \
      --workers 14 2>/dev/null > "$OUT/attention-tune-dq-regs-step19-h100.md"
  grep "| dq" "$OUT/attention-tune-dq-regs-step19-h100.md" | head -8; stamp "dQ sweep"; exit 0
fi
if [ "${1:-all}" = tests ]; then
  timeout 560 python3 -m pytest -q tests/test_attention_kernels.py tests/test_attention_cpp.py -k gpu 2>&1 | tail -4
  stamp "tests"; exit 0
fi
if [ "${1:-all}" = confirm ]; then
  timeout 240 python3 -m pytest -q tests/test_attention_kernels.py tests/test_attention_machine_code.py 2>&1 | tail -3
  stamp "tests"
  for run in 1 2; do leaderboard "attention-leaderboard-step19-run$run-h100.jsonl"; stamp "leaderboard $run"; done
  gluon_regs "attention-dkdv-regs-step19-confirm-h100" 150; stamp "run_ws"; exit 0
fi
timeout 360 python3 scripts/flash_tune.py --candidates shipped --loads tma --regs both --workers 14 \
    --output "$OUT/attention-tune-regs-step19-h100.json" > "$OUT/attention-tune-regs-step19-h100.md" 2>/tmp/t.err
grep -v '^{' /tmp/t.err | grep -v "Warning\|warn_once" | tail -5
stamp "tune"
gluon_regs "attention-dkdv-regs-step19-h100"; stamp "gluon dK/dV with K and V in registers"
