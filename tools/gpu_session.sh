#!/usr/bin/env bash
# One lent-GPU session in one command: build the package for the machine's GPU, run the GPU
# suite, then each further step given as an argument, in order, while the time budget lasts.
# Logs go to $OUT (the device tool brings that folder back).
#
#   [GPU_SUITE=0] tools/gpu_session.sh BUDGET_S 'step one' 'step two' ...
#
# A step is a shell command run from the repository root; it is skipped, with a line saying so,
# once BUDGET_S seconds have passed since the start. Its output is appended to $OUT/steps.log.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
budget=${1:?budget in seconds}
shift
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__)"
  date -u; } > "$OUT/env.txt" 2>&1  # no git state: the lent machine's copy of .git need not match the tree

if ! python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"
  exit 1
fi
echo "built in $(elapsed) s"
python3 -c "import portable_softmax as ps, json; print(json.dumps(ps.backend_info(), indent=1))" > "$OUT/info.json" 2>&1

# 480 s: the suite took 258 s on a warm H100 (97 tests) and ran past 300 s on a freshly started one.
# GPU_SUITE=0 skips it (measurement sessions of a tree whose kernels a full run has covered).
if [[ "${GPU_SUITE:-1}" != 0 ]]; then
  timeout 480 python3 -m pytest -m gpu -q -ra -p no:cacheprovider --durations=5 tests > "$OUT/gpu.log" 2>&1
  echo "gpu suite rc=$? at $(elapsed) s: $(tail -1 "$OUT/gpu.log")"
fi

for step in "$@"; do
  if (( $(elapsed) > budget )); then
    echo "skipped (budget): $step" | tee -a "$OUT/steps.log"
    continue
  fi
  echo "### $step" >> "$OUT/steps.log"
  bash -c "$step" >> "$OUT/steps.log" 2>&1
  echo "step rc=$? at $(elapsed) s: $step"
done
