#!/usr/bin/env bash
# The GPU checks of issue #14 in one run (about 4.5 minutes on one H200 with PYTEST_ARGS="-n 8"): the CUDA tests
# (tests/cuda and every test's `cuda` variant), the GPU rows of the scale benchmark (benchmarks/scale_gpu.md), 10,000
# MLP clients of 600 examples each, the issue's prototype setting (benchmarks/scale_gpu_10k_600.md), a profile of the
# 100-client round that also locates its host synchronisations (benchmarks/profile_round_gpu.md), and a timing of
# the two forms of per-example convolution gradients on CUDA (benchmarks/conv_grads_cuda.md); also issue #11's QuAFL
# simulation against its per-client loop, both on the GPU (benchmarks/quafl_speed_cuda.md), and issue #17's
# DP-SGD throughput against Opacus (benchmarks/dp_throughput_cuda.md; where Opacus imports). A step that fails
# leaves its record as it was (scale.py writes nothing when a cell failed); the logs go to OUTDIR.
#
# Usage: benchmarks/gpu_checks.sh [OUTDIR]        (default runs/gpu_checks)
#   PYTHON=python3 for another interpreter (with this checkout on PYTHONPATH when trustfl is not installed there);
#   PYTEST_ARGS="-n 8" to spread the tests over pytest-xdist workers where it is installed.
#   FULL_SUITE=1 to run the whole suite there first (OMP_NUM_THREADS=1 per worker; -v, so that each failure's name
#   is in the log as it happens even if the step is stopped at its time limit; 14 workers took over 400 s on an H200).
#   FIRST_TESTS="NODE_ID ..." to run those tests before anything else, in one process with full tracebacks (a
#   whole-suite run that reaches its time limit prints none), e.g.
#   FIRST_TESTS="tests/fuzz/test_configs.py::test_config_errors_are_config_errors tests/test_startup.py"
#   A machine whose Python lacks some dependencies and cannot download them: install their wheels with
#   `pip install --no-deps --target DIR` and run with PYTHONPATH="$PWD:DIR".
set -uo pipefail
out=${1:-runs/gpu_checks}
py=${PYTHON:-.venv/bin/python}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
"$py" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, \
torch.cuda.get_device_name())" | tee "$out/gpu.txt" || exit 2

# shellcheck disable=SC2086
if [ -n "${FIRST_TESTS:-}" ]; then
    OMP_NUM_THREADS=1 timeout 300 "$py" -m pytest -v -p no:cacheprovider $FIRST_TESTS --tb=long -rfE \
        > "$out/first_tests.log" 2>&1
    echo "first tests: exit $?"; grep -E "^E |^FAILED|^ERROR| passed| failed" "$out/first_tests.log" | head -60
fi

# shellcheck disable=SC2086
if [ "${FULL_SUITE:-0}" = 1 ]; then
    OMP_NUM_THREADS=1 timeout 900 "$py" -m pytest -v -p no:cacheprovider ${PYTEST_ARGS:-} tests --tb=short \
        > "$out/full_suite.log" 2>&1
    echo "whole suite: exit $?"; grep -E "FAILED|ERROR" "$out/full_suite.log" | head -40; tail -1 "$out/full_suite.log"
fi

# shellcheck disable=SC2086
timeout 400 "$py" -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-} tests -k cuda --tb=short --durations=15 \
    > "$out/cuda_tests.log" 2>&1
echo "CUDA tests: exit $?"; tail -3 "$out/cuda_tests.log"

timeout 300 "$py" benchmarks/scale.py --device cuda --data resident --no-million --out benchmarks/scale_gpu.md \
    > "$out/scale.log" 2>&1
echo "scale rows: exit $?"; grep -E "^\| (MLP|CNN)" benchmarks/scale_gpu.md

timeout 150 "$py" benchmarks/scale.py --device cuda --data resident --no-million --models mlp --cohorts 10000 \
    --large-samples 600 --max-plain-clients 0 --out benchmarks/scale_gpu_10k_600.md > "$out/scale_10k_600.log" 2>&1
echo "10,000 x 600: exit $?"; grep -E "^\| MLP" benchmarks/scale_gpu_10k_600.md

profile="python3 benchmarks/profile_round.py --device cuda --clients 100 --sync-debug"
if timeout 90 "$py" benchmarks/profile_round.py --device cuda --clients 100 --sync-debug > "$out/profile.txt" 2>&1
then
    { echo "\`$profile\` on $(cut -d' ' -f2- "$out/gpu.txt") (torch $(cut -d' ' -f1 "$out/gpu.txt")), its \
standard output and error as printed:"; echo; echo '```'; cat "$out/profile.txt"; echo '```'; } \
        > benchmarks/profile_round_gpu.md
fi
echo "profile: $(head -1 "$out/profile.txt"); $(grep -c "synchroniz" "$out/profile.txt") synchronisation lines"

timeout 60 "$py" benchmarks/conv_grads.py --device cuda --out benchmarks/conv_grads_cuda.md > "$out/conv_grads.log" 2>&1
echo "conv grads (products vs grouped on CUDA): exit $?"; grep -E "^\| (cnn|3)" benchmarks/conv_grads_cuda.md

timeout 240 "$py" benchmarks/quafl_speed.py --device cuda --processes 1 --out benchmarks/quafl_speed_cuda.md \
    > "$out/quafl_speed.log" 2>&1
echo "QuAFL speed on CUDA, trustfl vs the per-client loop (issue #11): exit $?"
grep -E "^Acceptance|^\| (trustfl \(as|plain loop)" benchmarks/quafl_speed_cuda.md

# Issue #17 on CUDA: needs Opacus importable (pure Python: carry its package directory and put it on PYTHONPATH).
if "$py" -c "import opacus" 2> /dev/null; then
    timeout 180 "$py" benchmarks/dp_throughput.py --device cuda --threads 0 --repeats 3 --min-time 0.3 \
        --out benchmarks/dp_throughput_cuda.md > "$out/dp_throughput.log" 2>&1
    echo "DP-SGD throughput on CUDA, trustfl vs Opacus (issue #17): exit $?"
    grep -E "^\| (mlp|cnn)" benchmarks/dp_throughput_cuda.md | head -4
else
    echo "DP-SGD throughput on CUDA (issue #17): skipped, opacus is not importable here"
fi
