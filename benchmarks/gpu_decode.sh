#!/usr/bin/env bash
# The decode loop's GPU tests and the equal-work decode benchmark, on the GPU machine (after its set-up).
# Usage: bash benchmarks/gpu_decode.sh OUT_DIR PAIRS GAMMAS BATCHES SEEDS [PYTEST_TARGETS|none]
#   e.g. bash benchmarks/gpu_decode.sh $OUT "embedded cost-1.5b cost-7b" 1,2,3,4,5,6,8,10,12,auto 1,4 5 tests
set -uo pipefail
out=${1:?output dir}; pairs=${2:?pairs}; gammas=${3:?gammas}; batches=${4:?batches}; seeds=${5:?seeds}
tests=${6:-none}
export PYTHONUNBUFFERED=1
if [ "$tests" != none ]; then
  python3 -m pytest -m gpu -q -p no:cacheprovider $tests 2>&1 | tail -40 | tee "$out/pytest_gpu.txt"
fi
for pair in $pairs; do
  start=$(date +%s)
  python3 cli.py bench decode --device cuda --pair "$pair" --pairs-dir /tmp/pairs --methods exact,greedy \
    --gamma "$gammas" --batch "$batches" --seeds "$seeds" --max-new-tokens 128 \
    --json "$out/decode_${pair}.json" --plot "$out/decode_${pair}.png" 2>&1 | grep -v "it/s"
  echo "$pair: $(( $(date +%s) - start )) s"
done
