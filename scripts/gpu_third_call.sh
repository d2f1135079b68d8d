set -uo pipefail
. .gpu/setup.sh >/dev/null
start=$(date +%s)
mkdir -p "$OUT/m" /tmp/mem /tmp/st
# 2025 nsys stats on the very SQLite files that are committed, so the tests compare like with like.
for f in tests/fixtures/kernels/h100_tiny_train_bf16 tests/fixtures/kernels/h100_tiny_train_fp32 profiles/examples/small_ctx128_train_bf16; do
  n=$(basename $f)
  for r in cuda_gpu_kern_sum nvtx_kern_sum cuda_gpu_mem_time_sum; do
    "$NSYS" stats --report $r --format csv $f.sqlite > /tmp/st/nsys2025_${n}_$r.csv 2>/dev/null
    "$NSYS" stats --report $r $f.sqlite > /tmp/st/nsys2025_${n}_$r.txt 2>/dev/null
  done
  "$NSYS" stats --report cuda_gpu_kern_sum --timeunit msec --format csv $f.sqlite > /tmp/st/nsys2025_${n}_cuda_gpu_kern_sum_msec.csv 2>/dev/null
done
python3 -m pytest -q tests/test_memory_record.py tests/test_memory_analyze.py tests/test_memory_snapshot.py 2>&1 | tail -4
python3 -m profiler_kit memory --model tiny --ctx 128 --mode train --steps 1 --warmup 1 --output-dir /tmp/st --no-plot > /dev/null
(cd /tmp && tar czf "$OUT/st.tar.gz" st)
for mp in "" "--mixed-precision"; do for mode in forward train; do for ctx in 128 256 512; do
  t=xl_ctx${ctx}_${mode}${mp:+_bf16}
  timeout 120 python3 -m profiler_kit memory --model xl --ctx $ctx --mode $mode $mp --output-dir /tmp/mem --top 8 --format markdown > "$OUT/m/$t.md" 2> "$OUT/m/$t.err"
  echo "$t rc=$? $(( $(date +%s) - start ))s"
  cp /tmp/mem/$t.json "$OUT/m/" 2>/dev/null; [ $ctx = 256 ] && cp /tmp/mem/$t.png "$OUT/m/" 2>/dev/null
done; done; done
(cd "$OUT" && tar czf m.tar.gz m && rm -rf m)
left=$(( 560 - ($(date +%s) - start) ))
echo "compile sweep with ${left}s"
[ $left -gt 30 ] && timeout $left bash scripts/gpu_bench_sweep.sh results/bench_h100_compile.jsonl compile 2>&1 | grep -E "^\|" | tail -3
cp results/bench_h100_compile.jsonl "$OUT/"
