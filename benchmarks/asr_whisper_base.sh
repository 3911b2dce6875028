#!/usr/bin/env bash
# The paper's ASR table on a real model, on the CPU: Whisper base (public CTranslate2 weights, converted
# without torch) as target, and as draft either itself or its weights rounded to int8; the ten
# pocketsphinx-testdata clips (five LibriVox, five "cards"); gamma 5, T = 1, seeds 0..4; every method.
# Needs: pip install -e ".[cpu,eval,bench]" and apt-get install pocketsphinx-testdata.
# Usage: bash benchmarks/asr_whisper_base.sh [OUT_DIR]   (about 30 minutes on two CPU cores)
set -euo pipefail
out=${1:-/tmp/asr-whisper-base}
mkdir -p "$out"
cache=~/.cache/specsample/whisper-base
python3 -m models.fetch_whisper_base --cache "$cache"
[ -d "$cache/onnx-int8" ] || python3 -m models.convert_ct2_whisper "$cache/ct2" "$cache/onnx-int8" --int8-rounded
L=/usr/share/pocketsphinx/test/data/librivox C=/usr/share/pocketsphinx/test/data/cards
sed -E "s#<s> (.*) </s> \((.*)\)#{\"audio\": \"$L/\2.wav\", \"text\": \"\1\"}#" $L/transcription > "$out/ten.jsonl"
sed -E "s#<s> (.*) +</s> \((.*)\)#{\"audio\": \"$C/\2.wav\", \"text\": \"\1\"}#" $C/cards.transcription >> "$out/ten.jsonl"
for seed in 0 1 2 3 4; do
  specsample eval asr --target "$cache/onnx" --draft "$cache/onnx" --data "$out/ten.jsonl" --device cpu \
    --methods baseline,exact,sigmoid,sigmoid-paper,target --temperature 1 --seed $seed --no-progress \
    --json "$out/same_seed$seed.json" > /dev/null
  specsample eval asr --target "$cache/onnx" --draft "$cache/onnx-int8" --data "$out/ten.jsonl" --device cpu \
    --methods baseline,exact,sigmoid,sigmoid-paper --temperature 1 --seed $seed --no-progress \
    --json "$out/int8_seed$seed.json" > /dev/null
done
python3 benchmarks/asr_seeds_summary.py "$out"/same_seed*.json "$out"/int8_seed*.json \
  --json benchmarks/results/asr_whisper_base_cpu.json
