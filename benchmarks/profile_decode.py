"""Where the host time of a speculative decoding round goes (cProfile over one generate())."""
import cProfile
import pstats

from specsample_cupy import SpeculativeDecoder

dec = SpeculativeDecoder(device="cuda")
prompts = ["import os\n", "def main(argv):\n", "class Parser:\n", "    for key in items:\n"]
dec.generate(prompts, max_new_tokens=32, gamma=5, seed=0)           # warm-up: plans, sessions
prof = cProfile.Profile()
prof.enable()
out = dec.generate(prompts, max_new_tokens=128, gamma=5, seed=1)
prof.disable()
s = out.stats
print(f"rounds {s['rounds']}, wall/round {1e6 * s['wall_s'] / s['rounds']:.0f} us, model GPU time/round "
      f"{1e6 * s['model_time_s'] / s['rounds']:.0f} us, host overhead/round {1e6 * s['host_overhead_per_round_s']:.0f} us")
pstats.Stats(prof).sort_stats("tottime").print_stats(18)
