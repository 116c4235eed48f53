#!/usr/bin/env bash
# The GPU set on a lent GPU machine, as one bounded command (CI never runs it: it has no GPU).
# Uses the machine's own python3 (a CUDA build of torch, pytest, pytest-xdist, psutil);
# rankguard from src/, its pytest plugin registered through a dist-info folder of its own (the
# inner pytest sessions of the ranks marker's test find it by its entry point, as after a pip
# install).
# Usage: tests/gpu/run_gpu_set.sh OUT_DIR
# Writes OUT_DIR/gpu.log (the tests), peer_death.txt and .json (what a survivor's collective
# gives when its peer dies in it: bench/nccl_probe.py, about 40 s), heal.txt, in_place.txt and
# load.txt (the benches, RGBENCH=0 leaves them out) and journals.tgz (the tests' journals, logs
# and stacks); exits with pytest's code. The tests: at most 180 s for the pool's fault tests
# (one at a time: each compares the device's free memory, its pool's warm spare ready), 180 s
# for the rest of the set (4 tests at a time); on an H100 (2026-11-28) 53 s and 137 s, one of
# them 90 s of a hang since fixed. Then the probe (100 s at most), and the benches by priority
# only if under 300 s have gone (heal 60 s, in-place 100 s, the load bench until 420 s): 460 s
# at most. A step past its time gets SIGINT, then SIGKILL 10 s later: pytest then tears its
# tests down (their processes killed) and still reports what passed and failed, with each
# test's duration; a bench prints what it measured so far (SIGTERM left only a line of dots
# and processes on the GPU).
set -u
out=${1:?usage: run_gpu_set.sh OUT_DIR}
cd "$(dirname "$0")/../.."
site=$(mktemp -d)
mkdir "$site/rankguard-0.dist-info"
printf 'Metadata-Version: 2.1\nName: rankguard\nVersion: 0\n' > "$site/rankguard-0.dist-info/METADATA"
printf '[pytest11]\nrankguard = rankguard.testing.plugin\n' \
    > "$site/rankguard-0.dist-info/entry_points.txt"
export PYTHONPATH=$PWD/src:$site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
base=$(mktemp -d)
pytest=(python3 -m pytest -q -m gpu -p no:cacheprovider -rsP --durations=0 --durations-min=1
        -W ignore::pytest.PytestConfigWarning)
bounded=(timeout -s INT -k 10)  # SIGINT first: see above
{ nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"
  echo "== the pool's CUDA faults, one at a time"
} > "$out/gpu.log" 2>&1
SECONDS=0
"${bounded[@]}" 180 "${pytest[@]}" --basetemp "$base/faults" tests/gpu/test_nccl_pool_faults.py \
    >> "$out/gpu.log" 2>&1
first=$?
echo "exit $first after $SECONDS s" >> "$out/gpu.log"
echo "== the rest of the GPU set, 4 at a time" >> "$out/gpu.log"
began=$SECONDS
"${bounded[@]}" 180 "${pytest[@]}" -n 4 --basetemp "$base/set" \
    --ignore tests/gpu/test_nccl_pool_faults.py tests/gpu tests/runtime/test_fr_progress.py \
    >> "$out/gpu.log" 2>&1
code=$?
echo "exit $code after $((SECONDS - began)) s" >> "$out/gpu.log"
[ "$code" = 0 ] && code=$first
"${bounded[@]}" 100 python3 bench/nccl_probe.py --budget 90 --json "$out/peer_death.json" \
    --scenarios peer_death_sync,peer_death_wait,peer_death_blocking > "$out/peer_death.txt" 2>&1 \
    || echo "exit $?" >> "$out/peer_death.txt"
if [ "${RGBENCH:-1}" = 1 ] && [ "$SECONDS" -lt 300 ]; then
  # a pool's heals on GPU replicas (issue 31), recovery inside a DDP job on NCCL (issue 32),
  # then a pool under load with faults (issue 31) in the time left
  "${bounded[@]}" 60 python3 bench/serve_heal_bench.py --devices 0 --repeats 2 --no-cold \
      --heal-bound 20 > "$out/heal.txt" 2>&1 || echo "exit $?" >> "$out/heal.txt"
  "${bounded[@]}" 100 python3 bench/in_place_bench.py --device cuda --nproc 2 --steps 1500 \
      --warm 3 --cap 30 > "$out/in_place.txt" 2>&1 || echo "exit $?" >> "$out/in_place.txt"
  if [ "$SECONDS" -lt 360 ]; then
    "${bounded[@]}" $((420 - SECONDS)) python3 bench/serve_load_bench.py --devices 0 --only 2 \
        --requests 200 > "$out/load.txt" 2>&1 || echo "exit $?" >> "$out/load.txt"
  fi
fi
(cd "$base" && find . \( -name '*.jsonl' -o -name '*.log' -o -name '*.txt' -o -name '*.stacks' \) \
    -size -2M \
    | tar czf "$out/journals.tgz" -T -) 2>/dev/null
exit $code
