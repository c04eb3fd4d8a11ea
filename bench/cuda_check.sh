#!/usr/bin/env bash
# `make cuda-check`: everything that needs a GPU, in one run, its output under one folder
# (CUDA_CHECK_OUT, default ./cuda-check). Run it on a machine with a CUDA GPU; each part is
# timed and its exit status kept, so one failing part does not hide the others.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${CUDA_CHECK_OUT:-cuda-check}"
PY="${PYTHON:-.venv/bin/python}"
mkdir -p "$OUT"
{
    date -u +"%Y-%m-%d %H:%M UTC"
    git rev-parse --short HEAD 2>/dev/null || echo "no git"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
    "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
} > "$OUT/machine.txt" 2>&1
status=0
part() {
    local name="$1"
    shift
    local began=$SECONDS
    "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    echo "$name: exit $rc in $((SECONDS - began)) s" | tee -a "$OUT/summary.txt"
    [ "$rc" = 0 ] || status=1
}
part cuda-tests "$PY" -m pytest -q -m cuda -p no:cacheprovider tests
part multirank-tests "$PY" -m pytest -q -p no:cacheprovider tests/scaler/test_multirank.py \
    tests/scaler/test_scaler_diagnosis_multirank.py
part bench-multirank-gloo-cuda "$PY" bench/multirank.py --device cuda --worlds 2 --rounds 12
part bench-scaler-overhead "$PY" bench/scaler_overhead.py --device cuda --reps 21
part bench-telemetry "$PY" bench/telemetry.py --device cuda --training-rounds 15
part bench-diagnosis "$PY" bench/diagnosis.py --device cuda --reps 21
exit $status
