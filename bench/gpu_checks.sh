#!/usr/bin/env bash
# The GPU checks in one shot, on a bare machine with Python 3 and an NVIDIA GPU: a venv, the project
# installed into it, the CUDA tests, then bench/materialize_cuda.py and bench/plan_cuda.py (zoo.plan's
# max_batch against a real training step on this GPU's free memory). Logs go under $OUT when it is
# set (the device tool brings that folder back), else /tmp/zoo_gpu_checks. Exit status: 0 when the
# install, the tests and the bench all ran clean (the bench's targets are printed, not asserted).
#
#     bash bench/gpu_checks.sh
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS="${OUT:-/tmp/zoo_gpu_checks}"
VENV="${ZOO_GPU_VENV:-/tmp/zoo_gpu_venv}"
mkdir -p "$LOGS"
echo "logs: $LOGS"

nvidia-smi > "$LOGS/nvidia-smi.log" 2>&1 || echo "nvidia-smi failed (see $LOGS/nvidia-smi.log)"
if [ -d .whl ] && ! compgen -G ".whl/*.whl" > /dev/null; then
    echo ".whl/ holds no wheels: put the packages this machine's python3 lacks there (bench/README.md)"
    exit 1
elif [ -d .whl ]; then
    # Offline (the lent GPU machine reaches no package index): its own python3 already holds torch, timm,
    # transformers and the test tools; the few packages it lacks come as wheels in .whl (bench/README.md),
    # and the project goes in editable with no dependency resolution, since the machine's versions are not
    # constraints.txt's. The machine is thrown away afterwards, so installing into its python3 is fine.
    PY=python3
    if ! { "$PY" -m pip install --no-index --no-deps --no-compile .whl/*.whl &&
           "$PY" -m pip install --no-index --no-deps --no-build-isolation -e .; } > "$LOGS/install.log" 2>&1; then
        echo "offline install failed; the end of $LOGS/install.log:"
        tail -n 20 "$LOGS/install.log"
        exit 1
    fi
else
    # --system-site-packages: a torch the machine already has is used rather than downloaded again.
    if ! { python3 -m venv --system-site-packages "$VENV" &&
           "$VENV/bin/python" -m pip install -e '.[test,hf]' -c constraints.txt; } > "$LOGS/install.log" 2>&1; then
        echo "install failed; the end of $LOGS/install.log:"
        tail -n 20 "$LOGS/install.log"
        exit 1
    fi
    PY="$VENV/bin/python"
fi
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), \
'devices', torch.cuda.device_count())" 2>&1 | tee "$LOGS/torch.log"

status=0
# Every test with "cuda" in its id: the old round trip in test_materialize and the streaming ones
# (bit-exact fills through the pinned ring, round trips, casts, failure midway, copy=False, FSDP2), and
# zoo.plan's step at max_batch on an emulated RTX 3090.
"$PY" -m pytest -q -p no:cacheprovider -rs -k cuda tests/test_materialize.py tests/test_stream.py \
    tests/test_plan_cuda.py 2>&1 \
    | tee "$LOGS/tests.log" || status=1
# The same file without a GPU filter: the CPU runs of the same plan, as a cross-check on this machine.
"$PY" -m pytest -q -p no:cacheprovider -k "not cuda" tests/test_stream.py 2>&1 | tail -n 3 \
    | tee "$LOGS/tests_cpu.log" || status=1
"$PY" bench/materialize_cuda.py 2>&1 | tee "$LOGS/bench.log" || status=1
# ten timm models, a step at the planned max_batch and at max_batch + 1, against max_memory_allocated
"$PY" bench/plan_cuda.py 2>&1 | tee "$LOGS/plan.log" || status=1
echo "gpu checks: exit $status" | tee -a "$LOGS/bench.log"
exit $status
