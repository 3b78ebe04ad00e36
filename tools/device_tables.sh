#!/usr/bin/env bash
# The tables of a device section of docs/benchmarks.md in one call on a lent GPU: the package built
# for the machine, then every benchmark command that file lists (README commands), or the 64 MiB
# scans, each writing its table as Markdown and JSON under $OUT.
#
#   OUT=... tools/device_tables.sh commands|scans
#
# Run from the repository root; the benchmarks themselves run from a scratch directory outside the
# checkout, as the file's method says. $OUT/env.txt names the device, the driver and the versions.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT to a folder for the tables}
which=${1:?commands or scans}
mkdir -p "$OUT"
root=$(pwd)

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__)"
  date -u; } > "$OUT/env.txt" 2>&1
if ! python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"
  exit 1
fi

scan16=55924x600,47934x700,41943x800,33554x1000,27962x1200,22369x1500,16777x2000,13421x2500,11184x3000,8388x4000,6710x5000,5592x6000,4194x8000,3355x10000,2796x12000,2048x16384,1677x20000,1342x25000,1048x32000,838x40000,667x50257,512x65536,419x80000,335x100000,261x128256,256x131072,209x160000,176x190000,128x262144
scan32=55924x300,41943x400,33554x500,27962x600,20971x800,16777x1000,11184x1500,8388x2000,5592x3000,4194x4000,2796x6000,2048x8192,1398x12000,1024x16384,699x24000,524x32000,419x40000,333x50257,256x65536,209x80000,167x100000,130x128256,128x131072,88x190000,64x262144

case "$which" in
  commands) steps=(
    "sweep|--reps 10 --plot $OUT/benchmarks.png"
    "short|--shapes 134217x1000,2670x50257,33554432x2,22369621x3,33554432x4,13421772x5,11184810x6,19173961x7,8388608x8,16777216x16,16777216x31,2097152x64,2113665x127,1001624x67,528416x127,333874x201,263172x255,89478x1500,65536x2048,8192x16384 --reps 10"
    "mid16|--shapes 645277x208,466033x288,447392x300,350437x383,335544x400,261632x513,223324x601,191739x700,172738x777,149130x900,134083x1001 --dtypes float16,bfloat16 --reps 10"
    "long16|--dtypes float16,bfloat16 --shapes 2670x50257,1342x100000,1024x131072,1046x128256,704x190000,512x262144 --reps 10"
    "long32|--dtypes float32 --shapes 2097x32000,1700x40000,1335x50257,1200x56000,1024x65536,700x96000,523x128256,512x131072,256x262144 --reps 10"
    "row1e8|--shapes 1x100000000 --dtypes float32 --reps 10"
    "axis0|--shapes 8192x8192 --axis 0 --dtypes float32,bfloat16,float16 --reps 10"
    "axis0short|--shapes 2x33554432,4x16777216,8x8388608,16x4194304,64x1048576,300x223696 --axis 0 --dtypes float32,bfloat16,float16 --reps 10"
    "axis1|--shapes 262144x8x32,8192x64x128,16384x256x16 --axis 1 --dtypes float32,bfloat16,float16 --reps 10"
    "latency|--latency --dtypes float32") ;;
  scans) steps=(
    "scan16|--shapes $scan16 --dtypes float16,bfloat16 --reps 10"
    "scan32|--shapes $scan32 --dtypes float32 --reps 10") ;;
  *) echo "commands or scans, not $which" >&2; exit 2 ;;
esac

scratch=$(mktemp -d)
cd "$scratch" || exit 1
for step in "${steps[@]}"; do
  name=${step%%|*}
  args=${step#*|}
  start=$(date +%s)
  # shellcheck disable=SC2086  # the arguments are words
  portable-softmax bench $args --json "$OUT/$name.json" --markdown "$OUT/$name.md" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? in $(( $(date +%s) - start )) s"
done
cd "$root" || exit 1
