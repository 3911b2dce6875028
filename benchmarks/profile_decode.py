"""Where the host time of a speculative decoding round goes (cProfile over one generate(), after a
warm-up generate() of the same shapes so that captures and kernel compilation stay out)."""
import cProfile
import pstats
import sys

from specsample_cupy import SpeculativeDecoder

dec = SpeculativeDecoder(device="cuda", cuda_graphs="--no-cuda-graphs" not in sys.argv)
prompts = ["import os\n", "def main(argv):\n", "class Parser:\n", "    for key in items:\n"]
dec.generate(prompts, max_new_tokens=128, gamma=5, seed=1)           # warm-up: plans, graphs, kernels
prof = cProfile.Profile()
prof.enable()
out = dec.generate(prompts, max_new_tokens=128, gamma=5, seed=1)
prof.disable()
s = out.stats
print(f"cuda_graphs {s['cuda_graphs']}: rounds {s['rounds']}, wall/round {1e6 * s['wall_s'] / s['rounds']:.0f} us "
      f"(under cProfile), model GPU time/round {1e6 * s['model_time_s'] / s['rounds']:.0f} us")
stats = pstats.Stats(prof)
stats.sort_stats("tottime").print_stats(25)
stats.sort_stats("cumulative").print_stats(25)
