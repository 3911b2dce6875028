"""Auto gamma held to one gamma against that gamma fixed: what the policy's machinery costs apart from
its choices (its per-round host work, its cache sized for gamma_max, its cost calibration).

    auto [g, g]      generate(gamma="auto", gamma_min=g, gamma_max=g): every round has g drafts
    auto [g, 12]     the policy as `bench decode` runs it, for reference
    fixed g          generate(gamma=g)

Equal work (EOS ignored, 128 tokens per request), the benchmark's prompts (one per seed at B = 1),
an untimed warm-up call per seed first; median wall ms per call over the seeds and repeats. Each
configuration has a decoder of its own (what an automatic gamma keeps between calls stays its own).

    python3 benchmarks/auto_gamma_control.py [--device cuda] [--gamma 5] [--batch 1] [--method greedy]
                                             [--seeds 5] [--repeats 3]
"""
import argparse
import statistics

from specsample_cupy.bench_decode import DEFAULT_PROMPTS, prompt_set, prompts_for
from specsample_cupy.decoder import SpeculativeDecoder


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--method", default="greedy", choices=("greedy", "exact"))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    prompts = prompt_set([args.batch], DEFAULT_PROMPTS)
    g = args.gamma
    configs = {f"fixed {g}": dict(gamma=g), f"auto [{g}, {g}]": dict(gamma="auto", gamma_min=g, gamma_max=g),
               "auto [1, 12]": dict(gamma="auto", gamma_min=1, gamma_max=12)}
    temperature = 0.0 if args.method == "greedy" else 1.0

    decoders = {name: SpeculativeDecoder(device=args.device) for name in configs}

    def call(name, seed):
        dec, kw = decoders[name], configs[name]
        dec.time_model_runs = False
        out = dec.generate(prompts_for(prompts, args.batch, seed), max_new_tokens=args.max_new_tokens,
                           method=args.method, temperature=temperature, seed=seed, ignore_eos=True, **kw)
        return out.stats

    for name in configs:
        for seed in range(args.seeds):
            call(name, seed)
    print(f"device={decoders[name].device} B={args.batch} method={args.method} tokens={args.max_new_tokens}")
    print("| configuration | wall ms per call (median) | rounds (median) | mean gamma |")
    print("|---|---|---|---|")
    for name in configs:
        stats = [call(name, seed) for _ in range(args.repeats) for seed in range(args.seeds)]
        print(f"| {name} | {1e3 * statistics.median(s['wall_s'] for s in stats):.2f} | "
              f"{statistics.median(s['rounds'] for s in stats)} | "
              f"{statistics.median(s['mean_gamma'] for s in stats):.2f} |", flush=True)


if __name__ == "__main__":
    main()
