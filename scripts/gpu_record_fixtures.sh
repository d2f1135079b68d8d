#!/usr/bin/env bash
# Records the real-tool fixtures on the GPU machine: `. .gpu/setup.sh` first (NSYS, nvtx), run from the repo root.
# Writes everything under $1 (default fixtures-out/). Small workloads, so each file stays under 1 MB.
set -uo pipefail
out=${1:-fixtures-out}
mkdir -p "$out"
nsys_profile() {  # name, then record_step.py arguments
  local name=$1; shift
  "$NSYS" profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --capture-range=cudaProfilerApi \
    --capture-range-end=stop --force-overwrite=true -o "$out/$name" python3 scripts/record_step.py --kind nsys "$@"
  "$NSYS" export --type sqlite --force-overwrite=true -o "$out/$name.sqlite" "$out/$name.nsys-rep"
  # nsys refuses --force-export on .sqlite input; stats on the report itself re-uses the fresh export.
  for report in cuda_gpu_kern_sum nvtx_kern_sum cuda_api_sum cuda_gpu_mem_time_sum; do
    "$NSYS" stats --report $report --format csv "$out/$name.sqlite" > "$out/${name}_$report.csv"
    "$NSYS" stats --report $report "$out/$name.sqlite" > "$out/${name}_$report.txt"
  done
  "$NSYS" stats --report cuda_gpu_kern_sum --timeunit msec --format csv "$out/$name.sqlite" \
    > "$out/${name}_cuda_gpu_kern_sum_msec.csv"
  "$NSYS" stats --report cuda_gpu_kern_sum --force-export=true "$out/$name.nsys-rep" > "$out/${name}_rep_stdout.txt"
}
nsys_profile h100_tiny_train_bf16 --model tiny --ctx 128 --mode train --mixed-precision
nsys_profile h100_tiny_train_fp32 --model tiny --ctx 128 --mode train
nsys_profile h100_small_ctx128_train_bf16 --model small --ctx 128 --mode train --mixed-precision
python3 scripts/record_step.py --kind torch --model tiny --ctx 128 --mode train --mixed-precision \
  --out "$out/h100_tiny_train_bf16_trace.json"
gzip -kf "$out/h100_tiny_train_bf16_trace.json"
python3 scripts/record_step.py --kind memory --model tiny --ctx 128 --mode train --out "$out/h100_tiny_train_snapshot.pickle"
ls -la "$out"
