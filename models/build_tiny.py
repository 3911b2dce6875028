"""Random-weight target/draft pair with a tiny shared tokenizer, for tests.

Builds in well under a second and needs only numpy, onnx and tokenizers.
The draft is the target with its weights mixed with noise from another seed
(optionally also shallower), so its next-token distributions are correlated
with the target's: expected acceptance is roughly 0.45-0.7, neither ~0 nor ~1. The final LayerNorm gain is
calibrated so that logits have a chosen spread: distributions are neither
near-uniform nor near one-hot.

    python -m models.build_tiny out/tiny --vocab-size 16
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

from .export_onnx import export_decoder, random_weights
from .reference_forward import reference_logits

EOS_TOKEN = "<|endoftext|>"
UNK_TOKEN = "<unk>"
EOS_ID = 0
# Readable characters first, so a 16-token vocabulary still spells words.
_CHARS = " etaoinshrdlucmfwypvbgkjqxz" + "ETAOINSHRDLUCMFWYPVBGKJQXZ" + "0123456789" + \
    ".,:;!?'\"()[]{}<>-_=+*/\\|&%$#@^~`\n\t"


def tiny_vocab(vocab_size: int) -> list[str]:
    """Token strings for ids 0..vocab_size-1: EOS, unk, then single characters."""
    if vocab_size < 3:
        raise ValueError("vocab_size must be >= 3")
    chars = list(_CHARS)
    code = 0xC0  # then Latin-1 supplement letters and beyond, all single chars
    while len(chars) < vocab_size - 2:
        if chr(code) not in _CHARS and chr(code).isprintable():
            chars.append(chr(code))
        code += 1
    return [EOS_TOKEN, UNK_TOKEN] + chars[:vocab_size - 2]


def write_tiny_tokenizer(out_dir: str, vocab_size: int) -> str:
    """A character-level WordLevel tokenizer.json whose ids are 0..vocab_size-1."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(tiny_vocab(vocab_size))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([EOS_TOKEN])
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "tokenizer.json")
    tok.save(path)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": EOS_TOKEN, "eos_token": EOS_TOKEN, "unk_token": UNK_TOKEN,
                   "model_max_length": None, "tokenizer_class": "PreTrainedTokenizerFast"},
                  f, indent=2)
    return path


def _calibrate_logit_std(weights, config, target_std, seed):
    """Scale ln_f so that logits on random text have std ``target_std``.

    The LM head is tied to wte, so the final LayerNorm gain is the one knob
    that sharpens or flattens every output distribution.
    """
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, config["vocab_size"], (2, min(24, config["n_positions"])))
    logits = reference_logits(weights, config, ids)
    std = float((logits - logits.mean(-1, keepdims=True)).std())
    gain = target_std / max(std, 1e-6)
    weights["ln_f.weight"] = weights["ln_f.weight"] * gain
    weights["ln_f.bias"] = weights["ln_f.bias"] * gain


def _draft_weights(target, t_cfg, d_cfg, similarity, seed):
    """First d_cfg['n_layer'] target layers + embeddings, mixed with noise.

    Each tensor becomes similarity * target + sqrt(1 - similarity^2) * noise
    (noise rescaled to the tensor's std), which keeps its overall scale.
    """
    noise = random_weights(d_cfg, seed=seed, scale=0.2)
    keep = float(similarity)
    mix = float(np.sqrt(max(0.0, 1.0 - keep * keep)))
    out = {}
    for name, n in noise.items():
        t = target[name]
        if name.endswith((".weight", ".bias")) and ("ln_" in name):
            out[name] = t.copy()  # LayerNorm params stay (ln_f carries the logit scale)
        else:
            std = float(t.std()) or 1.0
            out[name] = (keep * t + mix * n / 0.2 * std).astype(np.float32)
    return out


def build_tiny_pair(out_dir: str, *, vocab_size: int = 16, seed: int = 0, n_embd: int = 32,
                    n_layer: int = 2, n_head: int = 2, n_positions: int = 256,
                    draft_n_layer: int | None = None, logit_std: float = 2.0,
                    draft_similarity: float = 0.97,
                    weight_dtype: str = "float16") -> tuple[str, str]:
    """Write out_dir/target and out_dir/draft; return their paths.

    Each holds model.onnx, config.json, generation_config.json, tokenizer.json.
    Both models share the tokenizer (EOS/BOS id 0) and vocabulary size.
    """
    t_cfg = dict(model_type="gpt2", vocab_size=vocab_size, n_positions=n_positions,
                 n_embd=n_embd, n_layer=n_layer, n_head=n_head, bos_token_id=EOS_ID,
                 eos_token_id=EOS_ID, layer_norm_epsilon=1e-5)
    d_cfg = dict(t_cfg, n_layer=draft_n_layer or n_layer)
    if d_cfg["n_layer"] > n_layer:
        raise ValueError("draft_n_layer must not exceed n_layer")

    target = random_weights(t_cfg, seed=seed, scale=0.2)
    draft = _draft_weights(target, t_cfg, d_cfg, draft_similarity, seed + 1)
    _calibrate_logit_std(target, t_cfg, logit_std, seed)
    _calibrate_logit_std(draft, d_cfg, logit_std, seed)

    dirs = []
    for name, w, cfg in (("target", target, t_cfg), ("draft", draft, d_cfg)):
        d = os.path.join(out_dir, name)
        export_decoder(w, cfg, d, weight_dtype=weight_dtype)
        write_tiny_tokenizer(d, vocab_size)
        dirs.append(d)
    return dirs[0], dirs[1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--vocab-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-embd", type=int, default=32)
    ap.add_argument("--n-layer", type=int, default=2)
    ap.add_argument("--n-head", type=int, default=2)
    ap.add_argument("--n-positions", type=int, default=256)
    a = ap.parse_args(argv)
    print(*build_tiny_pair(a.out_dir, vocab_size=a.vocab_size, seed=a.seed, n_embd=a.n_embd,
                           n_layer=a.n_layer, n_head=a.n_head, n_positions=a.n_positions))


if __name__ == "__main__":
    main()
