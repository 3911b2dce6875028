#!/usr/bin/env bash
# Everything a GPU release is checked with, in one device session: GPU tests, sanitizers,
# verify and decode benchmarks, the task evaluations on tiny models.
# Usage (GPU machine, after .device/setup-gpu.sh): bash benchmarks/device_all.sh OUTDIR [checks|bench|all]
out=${1:?outdir}
part=${2:-all}
export PYTHONUNBUFFERED=1
log="$out/summary.txt"
step() { echo "== $1" | tee -a "$log"; }

if [ "$part" != bench ]; then
step "kernel variants (device us, exact)"
timeout 120 python3 benchmarks/ab_kernel.py 2>&1 | tail -1 | tee -a "$log"
SPECSAMPLE_KERNEL_DEFINES=-DSS_FAST_HANDOFF timeout 120 python3 benchmarks/ab_kernel.py 2>&1 | tail -1 | tee -a "$log"
SPECSAMPLE_KERNEL_DEFINES=-DSS_FAST_HANDOFF timeout 120 python3 benchmarks/sanitize_verify.py 2>&1 | tail -1 | sed 's/^/fast handoff: /' | tee -a "$log"
SPECSAMPLE_KERNEL_DEFINES=-DSS_FAST_HANDOFF timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_verify_gpu.py 2>&1 | tail -1 | sed 's/^/fast handoff: /' | tee -a "$log"

step "pytest -m gpu"
timeout 420 python3 -m pytest -m gpu -q -rfE -s -p no:cacheprovider tests > "$out/pytest_gpu.txt" 2>&1
grep -E "mismatches per config|^(FAILED|ERROR)|passed|failed" "$out/pytest_gpu.txt" | cut -c1-600 | tee -a "$log"

step "compute-sanitizer"
for tool in memcheck racecheck synccheck; do
  timeout 150 compute-sanitizer --tool $tool python3 benchmarks/sanitize_verify.py 2>&1 \
    | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|mismatching" | sed "s/^/$tool: /" | tee -a "$log"
done

fi
if [ "$part" != checks ]; then
step "bench verify"
timeout 400 python3 cli.py bench verify --json "$out/bench_verify.json" 2>/dev/null | grep -vE "^\s*$" > "$out/bench_verify.txt"
grep -E "│ (float32|float16) .* │ 5 │" "$out/bench_verify.txt" | tee -a "$log" > /dev/null

step "bench decode"
timeout 300 python3 cli.py bench decode --device cuda --json "$out/bench_decode.json" 2>&1 | tail -n 25 | tee -a "$log"

step "eval (tiny models)"
python3 -m models.build_tiny_whisper /tmp/tiny_whisper > /dev/null 2>&1
python3 -c "from models.build_tiny import build_tiny_pair; print(build_tiny_pair('/tmp/tiny_text', vocab_size=64, seed=1))" > /dev/null
timeout 300 python3 cli.py eval asr --target /tmp/tiny_whisper/target --draft /tmp/tiny_whisper/draft \
  --data .device/librivox --device cuda --json "$out/eval_asr.json" --plot "$out/eval_asr.png" --no-progress 2>&1 | tail -n 20 | tee -a "$log"
timeout 300 python3 cli.py eval summarize --target /tmp/tiny_text/target --draft /tmp/tiny_text/draft \
  --data .device/articles.jsonl --device cuda --json "$out/eval_summarize.json" --plot "$out/eval_summarize.png" --no-progress 2>&1 | tail -n 20 | tee -a "$log"
fi
