#!/usr/bin/env bash
# On the GPU machine (after its set-up), one call: verification's GPU tests, the rows-read table of this
# tree against another revision's (alternated runs, combined) and, at B = 1, exact's time against the
# P2 slicing. What comes back stays within a few files: per-run JSON, the combined table, the sweep.
# Usage: bash benchmarks/gpu_verify.sh OUT_DIR OTHER_TREE [ROUNDS] [PYTEST_TARGETS|none]
#   OTHER_TREE: that revision's specsample_cupy/ and kernels_cu/ (git archive REV, unpacked there)
set -uo pipefail
out=${1:?output dir}; other=${2:?the other tree}; rounds=${3:-2}
tests=${4:-"tests/test_verify_gpu.py tests/test_verify_contract.py tests/test_verify_rows_read.py
  tests/test_verify_walk_gpu.py tests/test_verify_min_p_fused_gpu.py tests/test_verify_chi2_plans.py
  tests/test_verify_streams_gpu.py tests/test_verify_onehot.py tests/test_verify_warps_gpu.py"}
export PYTHONUNBUFFERED=1
here=$PYTHONPATH; workers=(); logs=$(mktemp -d)
python3 -c "import xdist" 2>/dev/null && workers=(-n 12 --dist loadfile)
if [ "$tests" != none ]; then
  python3 -m pytest -m gpu -q -p no:cacheprovider "${workers[@]}" $tests 2>&1 | tail -30 | tee "$out/pytest_verify.txt"
fi
for k in $(seq 1 "$rounds"); do
  for label in other this; do
    path=$here; [ $label = other ] && path="$other:$here"
    PYTHONPATH="$path" python3 benchmarks/verify_rows_read.py $label "$out/rr_$label$k.json" \
      > "$logs/rr_$label$k.log" 2>&1 || tail -5 "$logs/rr_$label$k.log"
  done
done
python3 benchmarks/verify_rows_read.py --combine "$out/verify_rows_read.json" "$out"/rr_other*.json "$out"/rr_this*.json
for V in 256000 151936; do
  python3 benchmarks/plan_sweep.py --batch 1 --vocab $V --slices 0 --p2 0,1,2 --methods exact --reps 30
done 2>&1 | grep -v "^|---" | tee "$out/plan_b1.md"
