"""Host time of a generate() call's set-up with device rounds, piece by piece (median over calls):
prompt encoding, request state, caches, each prefill run (and ONNX Runtime's run call inside it),
DeviceRounds' start, and the first GPU work's start relative to the call. Each piece is wrapped with
perf_counter, so the sum runs a little slower than an unwrapped call.
Usage (GPU): python3 benchmarks/profile_setup.py"""
import collections
import time

import numpy as np

from specsample_cupy import decode_device, decoder as decoder_module, detokenize, sessions
from specsample_cupy.bench_decode import DEFAULT_PROMPTS
from specsample_cupy.decoder import SpeculativeDecoder
from specsample_cupy.sessions_static import StaticDecoderSession

pieces = collections.defaultdict(list)
first, last = {}, {}


def wrap(owner, name, label):
    real = getattr(owner, name)

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            last[label] = time.perf_counter()
            pieces[label].append(last[label] - started)
            first.setdefault(label, started)
    setattr(owner, name, timed)


wrap(SpeculativeDecoder, "encode_prompts", "encode_prompts")
wrap(decoder_module._Requests, "__init__", "requests")
wrap(StaticDecoderSession, "new_cache", "new_cache")
wrap(decoder_module._Requests, "columns", "columns")
wrap(StaticDecoderSession, "forward", "forward (prefill)")
wrap(sessions.DecoderSession, "_run", "onnxruntime run call")
wrap(decode_device.DeviceRounds, "__init__", "DeviceRounds init")
wrap(decode_device.DeviceRounds, "_enqueue", "enqueue a round")
wrap(decode_device.DeviceRounds, "_read", "read a report")
wrap(detokenize.TextAssembler, "add", "decode new tokens")
wrap(detokenize.TextAssembler, "text", "finish a text")
real_iter = decode_device.DeviceRounds.__iter__


def rounds(self):
    yield from real_iter(self)
    last["rounds"] = time.perf_counter()


decode_device.DeviceRounds.__iter__ = rounds

dec = SpeculativeDecoder(device="cuda")
prompts = list(DEFAULT_PROMPTS[:4])
kwargs = dict(max_new_tokens=128, gamma=5, method="exact", temperature=1.0, seed=0)
for _ in range(3):
    dec.generate(prompts, **kwargs)
calls = 10
pieces.clear()
starts, tails = [], []
for _ in range(calls):
    first.clear()
    t0 = time.perf_counter()
    out = dec.generate(prompts, **kwargs)
    starts.append({k: v - t0 for k, v in first.items()})
    tails.append(t0 + out.stats["wall_s"] - last["rounds"])
print(f"per call ({calls} calls, rounds {out.stats['rounds']}): host us, median per occurrence x occurrences per call")
for label, times in pieces.items():
    per_call = len(times) // calls
    started = np.median([s[label] for s in starts if label in s]) * 1e6
    print(f"  {label:22s} {np.median(times) * 1e6:8.1f} x {per_call:3d}   first starts at {started:7.1f}")
print(f"  after the rounds, until the texts are ready: {np.median(tails) * 1e6:.1f} us")
tok = dec.tokenizer
for label, decode in (("decode, one call per text", lambda ids: [tok.decode(i, skip_special_tokens=True) for i in ids]),
                      ("encode, one call per text", lambda _: [tok.encode(p).ids for p in prompts])):
    runs = []
    for _ in range(20):
        started = time.perf_counter()
        decode(out.token_ids)
        runs.append(time.perf_counter() - started)
    print(f"  tokenizer {label}: {np.median(runs) * 1e6:.1f} us")
