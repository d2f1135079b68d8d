#!/usr/bin/env bash
# Record the GPU test fixtures of tests/fixtures/kernels and tests/fixtures/memory with real nsys and torch.
#
# Usage: tools/record_fixtures.sh [OUT]    (default: fixtures-out)
#
# Runs on a machine with a CUDA GPU and Nsight Systems, from the repository root: nsys is $NSYS, else the one on
# PATH, and profiler_kit must be importable by python3 (the installed package, or PYTHONPATH=$PWD). Records small
# workloads (the tiny and small presets at ctx 128), so each file stays under 1 MB; tests/fixtures/README.md lists
# the fixtures. Copy the files the tests need from OUT into tests/fixtures/kernels and tests/fixtures/memory
# (small_ctx128_train_bf16.{nsys-rep,sqlite} into profiles/examples). A failing command does not stop the others:
# their output, and `ls` at the end, show what is missing.
set -uo pipefail

case ${1:-} in
  -h | --help) sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
esac

out=${1:-fixtures-out}
nsys=${NSYS:-$(command -v nsys || true)}
[[ -n $nsys ]] || { echo "record_fixtures: no nsys: set \$NSYS or put nsys on PATH" >&2; exit 1; }
record=(python3 "$(dirname "$0")/record_workload.py")
mkdir -p "$out"

# `nsys stats` tag: nsys<year>_, as the stats fixtures are named (nsys2025_...).
tag=nsys$("$nsys" --version | grep -oE '[0-9]{4}\.[0-9]+' | head -1 | cut -d. -f1)_

# One workload under nsys, its SQLite export, and the `nsys stats` reports the tests read, in CSV and text;
# NAME, then record_workload.py arguments.
nsys_fixtures() {
  local name=$1
  shift
  "$nsys" profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --capture-range=cudaProfilerApi \
    --capture-range-end=stop --force-overwrite=true -o "$out/$name" "${record[@]}" --kind nsys "$@"
  "$nsys" export --type sqlite --force-overwrite=true -o "$out/$name.sqlite" "$out/$name.nsys-rep"
  for report in cuda_gpu_kern_sum nvtx_kern_sum cuda_gpu_mem_time_sum; do
    "$nsys" stats --report "$report" --format csv "$out/$name.sqlite" >"$out/$tag${name}_$report.csv"
    "$nsys" stats --report "$report" "$out/$name.sqlite" >"$out/$tag${name}_$report.txt"
  done
  "$nsys" stats --report cuda_gpu_kern_sum --timeunit msec --format csv "$out/$name.sqlite" \
    >"$out/$tag${name}_cuda_gpu_kern_sum_msec.csv"
}

nsys_fixtures h100_tiny_train_bf16 --model tiny --ctx 128 --mode train --mixed-precision
nsys_fixtures h100_tiny_train_fp32 --model tiny --ctx 128 --mode train
nsys_fixtures small_ctx128_train_bf16 --model small --ctx 128 --mode train --mixed-precision
"${record[@]}" --kind torch --model tiny --ctx 128 --mode train --mixed-precision \
  --out "$out/h100_tiny_train_bf16_trace.json"
gzip -kf "$out/h100_tiny_train_bf16_trace.json"
"${record[@]}" --kind memory --model tiny --ctx 128 --mode train --out "$out/h100_tiny_train_snapshot.pickle"
ls -la "$out"
