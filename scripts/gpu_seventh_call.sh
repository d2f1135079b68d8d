set -uo pipefail
. .gpu/setup.sh >/dev/null
start=$(date +%s)
timeout 60 python3 -m pytest -q tests/test_attention_bench.py -k compiled_backward 2>&1 | tail -2
F=results/attention/grid-h100.jsonl
timeout 300 python3 -m profiler_kit attention bench --impl compiled --batch 8 --d 16,32,64,128 --seq 256,1024,4096,8192,16384 --dtype fp32,bf16 --output $F --resume --format json > /dev/null 2> /tmp/grid-b.err; tail -2 /tmp/grid-b.err
cp $F "$OUT/"; echo "[$(( $(date +%s) - start ))s] compiled"
left=$(( 420 - ($(date +%s) - start) ))
[ $left -gt 30 ] && timeout $left bash scripts/gpu_bench_sweep.sh results/bench_h100_compile.jsonl compile > /dev/null 2>&1
cp results/bench_h100_compile.jsonl "$OUT/"; echo "[$(( $(date +%s) - start ))s] done"
