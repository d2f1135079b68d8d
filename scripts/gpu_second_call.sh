set -uo pipefail
. .gpu/setup.sh >/dev/null
mkdir -p "$OUT/fx"
bash scripts/gpu_record_fixtures.sh /tmp/fx > /tmp/fx.log 2>&1
cp /tmp/fx/*.csv /tmp/fx/*.txt "$OUT/fx/" ; tail -3 /tmp/fx.log
(cd "$OUT" && tar czf fx.tar.gz fx && rm -rf fx)
python3 -m pytest -q -x tests/test_benchmark_gpu.py 2>&1 | tail -15
bash scripts/gpu_bench_sweep.sh "$OUT/bench_h100.jsonl" 2>&1 | grep -v "━"
timeout 200 bash scripts/gpu_bench_sweep.sh "$OUT/bench_h100_compile.jsonl" compile 2>&1 | grep -v "━" | tail -30
