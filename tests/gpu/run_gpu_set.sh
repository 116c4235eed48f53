#!/usr/bin/env bash
# The GPU set on a lent GPU machine, as one bounded command (CI never runs it: it has no GPU).
# Uses the machine's own python3 (a CUDA build of torch, pytest, psutil); rankguard from src/.
# Usage: tests/gpu/run_gpu_set.sh OUT_DIR   (writes OUT_DIR/gpu.log; exits with pytest's code)
# At most 280 s of tests, then 80 s of the NCCL cost bench (RGBENCH=0 leaves it out): 6 minutes.
set -u
out=${1:?usage: run_gpu_set.sh OUT_DIR}
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"
} > "$out/gpu.log" 2>&1
timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider -rsP -W ignore::pytest.PytestConfigWarning \
    tests/gpu tests/runtime/test_fr_progress.py >> "$out/gpu.log" 2>&1
code=$?
echo "exit $code" >> "$out/gpu.log"
if [ "${RGBENCH:-1}" = 1 ]; then  # issue 29's cost figures, against torchrun
  timeout 30 python3 bench/collective_overhead.py --backend nccl --ranks 2 --sizes 4096 \
      --repeats 2 --iters 300 > "$out/bench_2_ranks.txt" 2>&1
  timeout 30 python3 bench/collective_overhead.py --backend nccl --ranks 2 --sizes 4096 \
      --repeats 2 --iters 300 --rankguard-env TORCH_NCCL_ENABLE_TIMING=1 \
      > "$out/bench_2_ranks_timing_on.txt" 2>&1
  timeout 20 python3 bench/collective_overhead.py --backend nccl --ranks 8 --sizes 4096 \
      --repeats 1 --iters 60 > "$out/bench_8_ranks.txt" 2>&1
fi
exit $code
