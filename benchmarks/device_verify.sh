#!/usr/bin/env bash
# One device session for the verification kernels: sanitizers, GPU tests, benchmark.
# Usage (GPU machine): bash benchmarks/device_verify.sh OUTDIR [bench args...]
out=${1:?outdir}; shift
export PYTHONUNBUFFERED=1
step() { echo "== $1"; }
step synccheck
SPECSAMPLE_KERNEL_LINEINFO=1 timeout 150 compute-sanitizer --tool synccheck python3 benchmarks/sanitize_verify.py > "$out/synccheck.txt" 2>&1
grep -E "ERROR SUMMARY|mismatching" "$out/synccheck.txt"; grep -m 3 -A2 "Barrier error\|Invalid" "$out/synccheck.txt" | cut -c1-200
step memcheck
timeout 150 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_verify.py > "$out/memcheck.txt" 2>&1
grep -E "ERROR SUMMARY|mismatching" "$out/memcheck.txt"
step racecheck
timeout 150 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_verify.py > "$out/racecheck.txt" 2>&1
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|mismatching" "$out/racecheck.txt"
step "pytest -m gpu"
timeout 900 python3 -m pytest -m gpu -q -rfE -s -p no:cacheprovider "${PYTEST_ARGS:-tests}" > "$out/pytest_gpu.txt" 2>&1
grep -E "mismatches per config|^(FAILED|ERROR)|passed|failed" "$out/pytest_gpu.txt" | cut -c1-400 | tail -25
if [ "$#" -gt 0 ]; then
  step bench
  timeout 900 python3 cli.py bench verify --json "$out/bench_verify.json" "$@" > "$out/bench_verify.txt" 2>&1
  tail -n 80 "$out/bench_verify.txt"
fi
