#!/usr/bin/env bash
# The README's pictures, drawn from the committed example reports into docs/img/ (replacing the ones there):
#   bash tools/docs_pictures.sh [PYTHON]
set -euo pipefail
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { sed -n 2,3p "$0"; exit 0; }
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
K=tests/fixtures/kernels
run() { PYTHONPATH=$PWD "$PY" -m profiler_kit "$@" --force --format json >/dev/null; }
run kernels summarize "$K/h100_example_mlp.sqlite" --plot docs/img/kernels_phases.png
run kernels summarize "$K/cpu_ddp2_gloo.rank0.json.gz" "$K/cpu_ddp2_gloo.rank1.json.gz" --plot docs/img/kernels_ranks.png
run kernels compare "$K/h100_tiny_train_fp32.sqlite" "$K/h100_tiny_train_bf16.sqlite" --plot docs/img/kernels_compare.png
run memory summarize memory_snapshots/examples/plain_adamw_fused.pickle --plot docs/img/memory.png
ls -l docs/img
