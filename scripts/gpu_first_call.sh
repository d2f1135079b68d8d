#!/usr/bin/env bash
# One device call: machine facts, fixture recording, GPU tests of the foundation, a quick benchmark.
set -uo pipefail
. .gpu/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, triton, pandas, rich, click; print(torch.__version__, triton.__version__, pandas.__version__)"
"$NSYS" --version
bash scripts/gpu_record_fixtures.sh /tmp/fx 2>&1 | tail -40
tar czf "$OUT/fixtures.tar.gz" -C /tmp fx
python3 -m pytest -q tests/test_benchmark_gpu.py 2>&1 | tail -5
python3 -m profiler_kit benchmark --model small,xl --ctx 256 --mode forward,train --warmup 3 --steps 5 --mixed-precision --format markdown
