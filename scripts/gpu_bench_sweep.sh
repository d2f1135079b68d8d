#!/usr/bin/env bash
# The foundation issue's H100 sweep, resumable: rows append to $1 (jsonl) as each config finishes.
# Usage: scripts/gpu_bench_sweep.sh OUT.jsonl [compile]   (run after `. .gpu/setup.sh` on the GPU machine)
set -uo pipefail
out=$1
flags=${2:+--compile}
for mp in "" "--mixed-precision"; do
  python3 -m profiler_kit benchmark --model small,medium,large,xl,2.7B --ctx 256 --mode forward,train \
    $mp $flags --output "$out" --resume --format markdown
done
