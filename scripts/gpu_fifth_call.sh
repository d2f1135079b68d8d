set -uo pipefail
. .gpu/setup.sh >/dev/null
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start ))s] $*"; }
mkdir -p "$OUT/a" /tmp/fa
timeout 330 python3 -m pytest -q -x tests/test_attention_kernels.py 2>&1 | tail -15; el kernel tests
timeout 120 python3 -m pytest -q tests/test_attention_bench.py -m gpu 2>&1 | tail -6; el bench gpu tests
timeout 150 python3 -m profiler_kit attention leaderboard --output "$OUT/a/leaderboard.jsonl" --format markdown 2>"$OUT/a/leaderboard.err" | tee "$OUT/a/leaderboard.md"; el leaderboard
timeout 150 python3 -m profiler_kit attention bench --impl flash-triton,sdpa-cudnn,sdpa-flash --batch 4 --heads 16 --d 128 --seq 4096 --dtype bf16 --causal --output "$OUT/a/issue6.jsonl" --format markdown 2>/dev/null | tee "$OUT/a/issue6_causal.md"
timeout 150 python3 -m profiler_kit attention bench --impl flash-triton,sdpa-cudnn,sdpa-flash --batch 4 --heads 16 --d 128 --seq 8192 --dtype bf16 --no-causal --output "$OUT/a/issue6.jsonl" --format markdown 2>/dev/null | tee "$OUT/a/issue6_noncausal.md"; el issue6
for a in sdpa flash; do
  timeout 90 python3 -m profiler_kit nsys --model tiny --ctx 128 --mode train --mixed-precision --attention $a --warmup 2 --steps 1 --output-dir /tmp/fx_$a --top 5 > /dev/null 2>&1
  cp /tmp/fx_$a/tiny_ctx128_train_bf16.sqlite "$OUT/a/h100_tiny_train_bf16_$a.sqlite"
done; el fixtures
timeout 120 python3 -m profiler_kit benchmark --model small,xl --ctx 256 --mode train --mixed-precision --attention flash --format markdown 2>/dev/null; el flash model
left=$(( 570 - ($(date +%s) - start) ))
[ $left -gt 30 ] && timeout $left bash scripts/gpu_bench_sweep.sh results/bench_h100_compile.jsonl compile > /dev/null 2>&1
cp results/bench_h100_compile.jsonl "$OUT/"; el done
