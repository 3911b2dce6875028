#!/usr/bin/env bash
# Compiles every kernel instantiation for sm_90 with nvcc and fails on local-memory spills.
# nvcc compiles exactly the text the package hands NVRTC: kernel_source() output, with the
# generated codes.cuh (error codes, Philox purposes from specsample_cupy/runtime/errors.py, runtime/philox.py)
# inlined, so there is no header file to keep in step.
# Usage: bash benchmarks/ptxas_check.sh [report-file]
set -euo pipefail
report=${1:-/tmp/specsample-ptxas.txt}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
: > "$report"
# verify.cu with every instantiation the package can launch named.
python3 -m specsample_cupy.verification.kernel_launch > "$dir/verify_all.cu"
nvcc -std=c++17 -arch=sm_90 -c -Xptxas -v "$dir/verify_all.cu" -o /dev/null 2>> "$report"
# The other kernels of kernels_cu/ (each names its own instantiations).
for cu in kernels_cu/*.cu; do
  name=$(basename "$cu")
  [ "$name" = verify.cu ] && continue
  python3 -m specsample_cupy.verification.kernel_launch --source "$name" > "$dir/$name"
  nvcc -std=c++17 -arch=sm_90 -c -Xptxas -v "$dir/$name" -o /dev/null 2>> "$report"
done
entries=$(grep -c "Compiling entry function" "$report")
spills=$(grep -E "bytes spill (stores|loads)" "$report" | grep -vc " 0 bytes spill stores, 0 bytes spill loads" || true)
regs=$(grep -oE "Used [0-9]+ registers" "$report" | awk '{print $2}' | sort -n | uniq | tr '\n' ' ')
echo "ptxas: $entries kernel instantiations for sm_90, registers used: $regs, instantiations with spills: $spills"
[ "$spills" -eq 0 ]
