#!/usr/bin/env bash
# One device session's checks and measurements: GPU tests (-k "$PYTEST_K", default all but the
# ASR evaluation; the evaluations need the wheels carried in .whl/), decode benchmarks (device
# rounds, host rounds, no CUDA graphs; skipped with NO_BENCH=1); with SWEEP=1 a B = 1 item-size sweep
# of the verification kernel, with PROFILE=1 where a device round's time goes, with SANITIZE=1
# memcheck and racecheck over the device-round kernels. GPU machine, after .device/setup-gpu.sh. Usage: bash benchmarks/device_session.sh OUT
out=${1:?outdir}
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
timeout 420 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests -k "${PYTEST_K:-not eval_asr}" > "$out/pytest_gpu.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest_gpu.txt" | cut -c1-300
if [ -z "$NO_BENCH" ]; then
  for g in "--cuda-graphs --device-rounds" "--cuda-graphs --host-rounds" "--no-cuda-graphs"; do
    name=$(echo $g | tr -d ' ')
    timeout 240 python3 cli.py bench decode --device cuda $g --json "$out/bench_decode$name.json" 2>&1 | grep -v "plugin EP" | tail -7
  done
fi
if [ -n "$SWEEP" ]; then
  for s in 1 8 16 32; do
    SPECSAMPLE_MIN_SWEEPS=$s timeout 100 python3 benchmarks/ab_kernel.py 2>&1 | tail -1 | sed "s/^/min sweeps $s: /"
  done
fi
if [ -n "$PROFILE" ]; then
  timeout 120 python3 benchmarks/profile_device_rounds.py 2>&1 | grep -v "plugin EP" | tail -6
fi
if [ -n "$SANITIZE" ]; then
  for t in memcheck racecheck; do
    timeout 120 compute-sanitizer --tool $t --kernel-name kns=draft_step_done --kernel-name kns=round_done --kernel-name kns=compact_plan \
      python3 benchmarks/sanitize_decode_round.py > "$out/$t.txt" 2>&1
    echo "$t rc=$?"; grep -E "SUMMARY|bad requests" "$out/$t.txt"
  done
fi
