#!/usr/bin/env bash
# Compiles every kernel instantiation for sm_90 with nvcc and fails on local-memory spills.
# Usage: bash benchmarks/ptxas_check.sh [report-file]
set -euo pipefail
report=${1:-/tmp/specsample-ptxas.txt}
src=$(mktemp --suffix=.cu)
python3 -m specsample_cupy.kernels > "$src"
nvcc -std=c++17 -arch=sm_90 -c -Xptxas -v "$src" -o /dev/null 2> "$report"
# The other kernels of kernels_cu/ (self-contained sources).
for cu in kernels_cu/*.cu; do
  [ "$(basename "$cu")" = verify.cu ] && continue
  nvcc -std=c++17 -arch=sm_90 -c -Xptxas -v "$cu" -o /dev/null 2>> "$report"
done
entries=$(grep -c "Compiling entry function" "$report")
spills=$(grep -E "bytes spill (stores|loads)" "$report" | grep -vc " 0 bytes spill stores, 0 bytes spill loads" || true)
regs=$(grep -oE "Used [0-9]+ registers" "$report" | awk '{print $2}' | sort -n | uniq | tr '\n' ' ')
echo "ptxas: $entries kernel instantiations for sm_90, registers used: $regs, instantiations with spills: $spills"
rm -f "$src"
[ "$spills" -eq 0 ]
