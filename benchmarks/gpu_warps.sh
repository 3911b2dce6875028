#!/usr/bin/env bash
# Truncated sampling on the GPU machine (after its set-up): the GPU tests that run warp_rows.cu, its A/B
# against another revision, and bench verify's truncation table, in one call.
# Usage: bash benchmarks/gpu_warps.sh OUT_DIR OTHER_KERNELS_DIR [VOCABS] [BATCHES]
#   OTHER_KERNELS_DIR: the other revision's kernels_cu/, e.g. made here before the call with
#   mkdir -p .ab && git archive REV kernels_cu | tar -x -C .ab (the GPU machine gets no git history)
#   e.g. bash benchmarks/gpu_warps.sh $OUT .ab/kernels_cu 151936 1,64
set -uo pipefail
out=${1:?output dir}; other=${2:?the other kernels_cu folder}; vocabs=${3:-151936}; batches=${4:-1,64}
export PYTHONUNBUFFERED=1
python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_verify_warps_gpu.py tests/test_decode_truncation_device.py \
  tests/test_verify_logprobs.py tests/test_verify_streams_gpu.py tests/test_continuous_batching_gpu.py 2>&1 \
  | tail -5 | tee "$out/pytest_warps.txt"
python3 benchmarks/warp_rows_ab.py --other "$other" --batch "$batches" --vocab "${vocabs%%,*}" --json "$out/warp_rows_ab.json"
python3 cli.py bench verify --methods exact --warp top_p=0.9 --warp top_k=50 --warp min_p=0.05 --vocab "$vocabs" \
  --gamma 5 --batch "$batches" --dtype float32,float16 --json "$out/verify_warps.json" 2>&1 | grep -v "it/s"
