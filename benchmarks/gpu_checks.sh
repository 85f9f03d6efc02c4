#!/usr/bin/env bash
# The GPU checks of issue #14 in one run (about 8 minutes on one H100): the CUDA tests (tests/cuda and every test's
# `cuda` variant), the GPU rows of the scale benchmark (rewrites benchmarks/scale_gpu.md), 10,000 MLP clients of 600
# examples each (the prototype setting), and a profile of the 100-client round that also locates its host
# synchronisations; and a timing of the two forms of per-example convolution gradients on CUDA (conv_grads.py).
#
# Usage: benchmarks/gpu_checks.sh [OUTDIR]        (default runs/gpu_checks; PYTHON=python3 for another interpreter)
set -uo pipefail
out=${1:-runs/gpu_checks}
py=${PYTHON:-.venv/bin/python}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
"$py" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, \
torch.cuda.get_device_name())" | tee "$out/gpu.txt" || exit 2

timeout 400 "$py" -m pytest -q -p no:cacheprovider tests -k cuda > "$out/cuda_tests.log" 2>&1
echo "CUDA tests: exit $?"; tail -3 "$out/cuda_tests.log"

timeout 300 "$py" benchmarks/scale.py --device cuda --data resident --no-million --out benchmarks/scale_gpu.md \
    > "$out/scale.log" 2>&1
echo "scale rows: exit $?"; grep -E "s/round" "$out/scale.log"; cp benchmarks/scale_gpu.md "$out/" 2>/dev/null

timeout 150 "$py" benchmarks/scale.py --device cuda --data resident --no-million --models mlp --cohorts 10000 \
    --large-samples 600 --max-plain-clients 0 --out "$out/scale_10k_600.md" > "$out/scale_10k_600.log" 2>&1
echo "10,000 x 600: exit $?"; grep -E "s/round" "$out/scale_10k_600.log"

timeout 90 "$py" benchmarks/profile_round.py --device cuda --clients 100 --sync-debug > "$out/profile.txt" 2>&1
echo "profile: exit $?"; head -1 "$out/profile.txt"; grep -c "synchroniz" "$out/profile.txt"

timeout 60 "$py" benchmarks/conv_grads.py --device cuda --out "$out/conv_grads_cuda.md" > "$out/conv_grads.log" 2>&1
echo "conv grads (products vs grouped on CUDA; the CPU picks grouped, CUDA the products): exit $?"
grep -E "^\| (cnn|3)" "$out/conv_grads_cuda.md"
