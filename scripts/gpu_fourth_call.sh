set -uo pipefail
. .gpu/setup.sh >/dev/null
start=$(date +%s)
mkdir -p /tmp/prof "$OUT"
PK_TEST_NSYS="$NSYS" python3 -m pytest -q tests/test_nsys_real.py tests/test_nsys_profiling.py 2>&1 | tail -4
make nsys PY=python3 MODEL=xl CTX=256 NSYS="$NSYS" 2>&1 | tail -8
for mode in train forward; do for mp in "" "--mixed-precision"; do for m in small medium large xl 2.7B; do
  [ $(( $(date +%s) - start )) -gt 420 ] && break 3
  timeout 100 python3 -m profiler_kit nsys --model $m --ctx 256 --mode $mode $mp --output-dir /tmp/prof > /tmp/prof/$m.$mode$mp.log 2>&1
  echo "$m $mode $mp rc=$? $(( $(date +%s) - start ))s"
done; done; done
ls -la /tmp/prof profiles | grep -E "sqlite|rep"
(cd /tmp/prof && tar czf "$OUT/prof.tar.gz" *.sqlite)
(cd profiles && tar czf "$OUT/xl.tar.gz" xl_ctx256_forward.sqlite)
left=$(( 560 - ($(date +%s) - start) ))
echo "compile sweep with ${left}s"
[ $left -gt 30 ] && timeout $left bash scripts/gpu_bench_sweep.sh results/bench_h100_compile.jsonl compile 2>&1 | grep -E "^\|" | tail -3
cp results/bench_h100_compile.jsonl "$OUT/"
