"""Real-shape draft/target pairs: random Hugging Face checkpoints at public models' shapes, written with
NumPy (models/hf_checkpoint.py) and converted (specsample_cupy.convert), built on the machine that
runs them, no download.

    pair            target (shape, layers)                 draft
    real-1.5b       Qwen2.5-1.5B                           Qwen2.5-0.5B (other random weights)
    real-7b         Qwen2.5-7B                             Qwen2.5-0.5B at the 7B's vocabulary
    real-1.5b-self  Qwen2.5-1.5B, layers >= 4 with zero    the target's first 4 layers
                    o_proj / down_proj (same logits as
                    its first 4 layers)
    real-7b-self    Qwen2.5-7B, the same with 4 layers     the target's first 4 layers

The independent pairs have real costs and no agreement (random weights: every draft is rejected), the
self-drafting pairs real costs and full agreement: greedy accepts every draft, and at T = 1 the
draft's final-norm scale (`draft_scale`, 1: identical distributions) sets how often it is accepted,
since the draft's logits are the target's times that scale. Embeddings are scaled so that logits have
a standard deviation of about LOGIT_STD: peaked, but not one-hot, distributions.

    python -m models.build_real_pair --pair real-1.5b-self --out DIR [--dtype float16] [--draft-scale 0.8]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from .hf_checkpoint import REAL_SHAPES, write_checkpoint

FORMAT_VERSION = 1
SELF_DRAFT_LAYERS = 4
LOGIT_STD = 3.0
PAIRS = {
    "real-1.5b": ("qwen2.5-1.5b", "qwen2.5-0.5b"),
    "real-7b": ("qwen2.5-7b", "qwen2.5-0.5b"),
    "real-1.5b-self": ("qwen2.5-1.5b", None),
    "real-7b-self": ("qwen2.5-7b", None),
}


def default_root() -> Path:
    return Path.home() / ".cache" / "specsample" / "pairs"


def _embed_scale(config: dict) -> float:
    return LOGIT_STD / float(np.sqrt(config["hidden_size"]))


def write_pair_checkpoints(name: str, out: Path, *, dtype: str = "float16", seed: int = 0,
                           draft_scale: float = 1.0) -> tuple[Path, Path]:
    """(target, draft): the named pair's Hugging Face checkpoints, written under out (module docstring)."""
    if name not in PAIRS:
        raise KeyError(f"unknown pair {name!r}; known: {sorted(PAIRS)}")
    target_shape, draft_shape = PAIRS[name]
    t_config = REAL_SHAPES[target_shape]
    target, draft = Path(out) / "target", Path(out) / "draft"
    if draft_shape is None:
        _write(t_config, target, dtype, seed, zero_layers_from=SELF_DRAFT_LAYERS)
        _write({**t_config, "num_hidden_layers": SELF_DRAFT_LAYERS}, draft, dtype, seed, final_norm_scale=draft_scale)
    else:
        _write(t_config, target, dtype, seed)
        _write({**REAL_SHAPES[draft_shape], "vocab_size": t_config["vocab_size"]}, draft, dtype, seed + 1,
               final_norm_scale=draft_scale)
    return target, draft


def _write(config: dict, out: Path, dtype: str, seed: int, **kw) -> None:
    write_checkpoint(out, config, dtype=dtype, seed=seed, embed_scale=_embed_scale(config), **kw)


def build_pair(name: str, out_root: Path | None = None, *, dtype: str = "float16", seed: int = 0,
               draft_scale: float = 1.0, attention: str = "onnx") -> tuple[Path, Path]:
    """(target_dir, draft_dir) of the named pair, built under out_root/name (name-gqa for the
    GroupQueryAttention layout) once and reused while its manifest (written last) matches."""
    from specsample_cupy.convert import convert

    if name not in PAIRS:
        raise KeyError(f"unknown pair {name!r}; known: {sorted(PAIRS)}")
    out = Path(out_root or default_root()) / (name if attention == "onnx" else f"{name}-{attention}")
    manifest = {"format": FORMAT_VERSION, "pair": name, "dtype": dtype, "seed": seed, "draft_scale": draft_scale,
                "attention": attention}
    target, draft = out / "target", out / "draft"
    if _read_json(out / "manifest.json") == manifest:
        return target, draft
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        for hf, dst in zip(write_pair_checkpoints(name, Path(tmp), dtype=dtype, seed=seed, draft_scale=draft_scale),
                           (target, draft)):
            convert(hf, dst, dtype=dtype, overwrite=True, attention=attention)
            shutil.rmtree(hf)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return target, draft


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", required=True, choices=sorted(PAIRS))
    parser.add_argument("--out", default=None, help="root folder (default ~/.cache/specsample/pairs)")
    parser.add_argument("--dtype", default="float16", choices=("float16", "float32"))
    parser.add_argument("--draft-scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--attention", default="onnx", choices=("onnx", "gqa"))
    args = parser.parse_args(argv)
    target, draft = build_pair(args.pair, Path(args.out) if args.out else None, dtype=args.dtype, seed=args.seed,
                               draft_scale=args.draft_scale, attention=args.attention)
    print(f"target {target}\ndraft  {draft}", file=sys.stderr)


if __name__ == "__main__":
    main()
