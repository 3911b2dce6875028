"""Acceptance measured in the decoding loop (CPU): accepted / proposed drafts over 8 prompts from the
held-out files (6 lines from a third into each), gamma = 4, method exact, T = 1, 64 new tokens.

    python -m models.loop_acceptance [--draft DIR] [--seeds 20]
"""
import argparse

import numpy as np

from .stdlib_corpus import list_files, read_texts, split_files
from specsample_cupy.decode.decoder import SpeculativeDecoder, default_model_dir


def heldout_prompts(n: int = 8, lines: int = 6) -> list[str]:
    held = split_files(list_files())[1]
    prompts = []
    for text in read_texts([held[i] for i in np.linspace(0, len(held) - 1, n).astype(int)]):
        rows = text.splitlines()
        k = len(rows) // 3
        prompts.append("\n".join(rows[k:k + lines]) + "\n")
    return prompts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", default=str(default_model_dir("draft")))
    ap.add_argument("--seeds", type=int, default=20)
    a = ap.parse_args(argv)
    dec = SpeculativeDecoder(default_model_dir("target"), a.draft, device="cpu")
    prompts = heldout_prompts()
    proposed = accepted = 0
    per_round = []
    for seed in range(a.seeds):
        s = dec.generate(prompts, max_new_tokens=64, gamma=4, method="exact", temperature=1.0, seed=seed).stats
        proposed, accepted = proposed + s["proposed"], accepted + s["accepted"]
        per_round.append(s["mean_accepted_per_round"])
    print(f"{a.seeds} seeds: accepted / proposed {accepted / proposed:.4f}, "
          f"mean accepted per round {np.mean(per_round):.3f}")


if __name__ == "__main__":
    main()
