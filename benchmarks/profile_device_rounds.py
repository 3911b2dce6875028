"""Where the wall time of a generate() with device rounds goes: set-up (prefill, state upload, first
feeds), the rounds, and the tail; GPU time of the model runs, verify() and the bookkeeping kernels
(events around each launch, so the measured call runs slightly slower than an unprofiled one).
Usage (GPU): python3 benchmarks/profile_device_rounds.py"""
import contextlib
import time

import cupy

from specsample_cupy import decode_device
from specsample_cupy import decoder as decoder_module
from specsample_cupy.bench_decode import DEFAULT_PROMPTS
from specsample_cupy.decoder import SpeculativeDecoder

dec = SpeculativeDecoder(device="cuda")
prompts = list(DEFAULT_PROMPTS[:4])
kwargs = dict(max_new_tokens=128, gamma=5, method="exact", temperature=1.0, seed=0)
for _ in range(2):
    dec.generate(prompts, **kwargs)   # warm-up: plans, graphs, kernels
base = dec.generate(prompts, **kwargs).stats

# The same call without the model runs' CUDA events (so no model time): what the timing itself costs.
real_timed_runs = decoder_module._timed_runs
decoder_module._timed_runs = lambda sessions, clock, kind=None: contextlib.nullcontext()
untimed = dec.generate(prompts, **kwargs).stats
decoder_module._timed_runs = real_timed_runs
print(f"wall per round with model-run events {1e6 * base['wall_s'] / base['rounds']:.1f} us, without "
      f"{1e6 * untimed['wall_s'] / untimed['rounds']:.1f} us")

marks, spans = {}, []
real_init, real_iter, real_call = decode_device.DeviceRounds.__init__, decode_device.DeviceRounds.__iter__, \
    decode_device._Launch.__call__


def init(self, *a, **k):
    marks["init"] = time.perf_counter()
    real_init(self, *a, **k)
    marks["ready"] = time.perf_counter()


def iterate(self):
    yield from real_iter(self)
    marks["rounds_done"] = time.perf_counter()


def call(self, stream):
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    real_call(self, stream)
    end.record(stream)
    spans.append((start, end))


real_prefill = SpeculativeDecoder._prefill


def prefill(self, *a, **k):
    marks["prefill_start"] = time.perf_counter()
    real_prefill(self, *a, **k)
    marks["prefill_done"] = time.perf_counter()


SpeculativeDecoder._prefill = prefill
decode_device.DeviceRounds.__init__, decode_device.DeviceRounds.__iter__ = init, iterate
decode_device._Launch.__call__ = call
t0 = time.perf_counter()
s = dec.generate(prompts, **kwargs).stats
t1 = time.perf_counter()
cupy.cuda.Device().synchronize()
kernel_s = sum(cupy.cuda.get_elapsed_time(a, b) for a, b in spans) / 1e3
R = s["rounds"]
print(f"unprofiled call: host overhead/round {1e6 * base['host_overhead_per_round_s']:.1f} us, "
      f"{base['tokens_per_s']:.0f} tokens/s, rounds {base['rounds']}")
print(f"profiled call: wall {1e3 * (t1 - t0):.2f} ms = set-up {1e3 * (marks['ready'] - t0):.2f} "
      f"(DeviceRounds init {1e3 * (marks['ready'] - marks['init']):.2f}) + rounds "
      f"{1e3 * (marks['rounds_done'] - marks['ready']):.2f} + tail {1e3 * (t1 - marks['rounds_done']):.2f}")
print(f"set-up steps (ms from the call): prefill starts {1e3 * (marks['prefill_start'] - t0):.2f}, both prefills "
      f"enqueued {1e3 * (marks['prefill_done'] - t0):.2f}, device rounds ready {1e3 * (marks['ready'] - t0):.2f}; "
      f"compactions {s['kv_compactions']}")
print(f"per round ({R}): wall {1e6 * (marks['rounds_done'] - marks['ready']) / R:.1f} us, model "
      f"{1e6 * s['model_time_s'] / R:.1f}, verify {1e6 * s['verify_time_per_round_s']:.1f}, bookkeeping kernels "
      f"{1e6 * kernel_s / R:.1f} ({len(spans)} launches), read wait {1e6 * s['read_wait_per_round_s']:.1f}, "
      f"overhead {1e6 * s['host_overhead_per_round_s']:.1f}")
