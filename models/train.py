"""Train the embedded stdlib-code target/draft pair (torch, CPU) and export it.

    python -m models.train            # 53 min (time-budgeted), CPU

Stages (each is skipped when its result already exists under --work-dir,
so an interrupted run resumes; --force redoes everything):
  1. a byte-level BPE tokenizer trained on the training files,
  2. the training files encoded to one token stream (documents joined by EOS),
  3. the target model, trained on next-token cross-entropy,
  4. the draft model, distilled from the target's soft labels (matching the
     target's distributions, not just its argmax, is what raises the
     speculative-sampling acceptance rate) with forward KL,
  5. the draft distilled further (--tune-minutes) with forward KL plus the
     total variation distance, which is 1 - acceptance (see ``distill_loss``),
  6. target and tuned draft exported with fp16 weights to --dest/{target,draft}/.
Checkpoints stay in --work-dir (ignored by git); only --dest is shipped.
--only-draft runs stages 4-5 (--force redoes them) and exports the draft
alone, for trying draft recipes (--draft-arch, --tv-weight, ...) against an
existing target.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from .export_onnx import export_decoder
from .stdlib_corpus import EOS_TOKEN, list_files, read_texts, split_files
from .torch_gpt import GPT

TARGET = dict(n_embd=128, n_layer=3, n_head=4)
DRAFT = dict(n_embd=64, n_layer=2, n_head=2)
DEFAULT_DEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stdlib-code")


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


def write_tokenizer(tok, out_dir: str):
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"), pretty=False)  # minified: size budget
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": EOS_TOKEN, "eos_token": EOS_TOKEN, "model_max_length": None,
                   "add_prefix_space": False, "tokenizer_class": "GPT2TokenizerFast"},
                  f, indent=2)
        f.write("\n")


def encode_stream(tok, texts: list[str]) -> np.ndarray:
    """All documents as one uint16 stream, each preceded by EOS (also used as BOS)."""
    eos = tok.token_to_id(EOS_TOKEN)
    parts = []
    for enc in tok.encode_batch(texts):
        parts.append(np.array([eos] + enc.ids, np.uint16))
    return np.concatenate(parts)


def batches(stream: np.ndarray, batch: int, seq: int, seed: int):
    """Endless random windows of seq+1 tokens (inputs and shifted targets)."""
    rng = np.random.default_rng(seed)
    hi = len(stream) - seq - 1
    while True:
        starts = rng.integers(0, hi, batch)
        w = torch.from_numpy(np.stack([stream[s:s + seq + 1] for s in starts]).astype(np.int64))
        yield w[:, :-1], w[:, 1:]


def lr_at(step: int, progress: float, peak: float, warmup: int = 100,
          floor: float = 0.1) -> float:
    """Linear warmup over ``warmup`` steps, then cosine to ``floor`` x peak over progress 0..1."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def make_optimizer(model, lr: float):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


def distill_loss(logits, soft, tv_weight: float = 0.0):
    """Soft-label cross-entropy (forward KL(teacher || student) + const), plus
    ``tv_weight`` x the total-variation distance TV(p, q) = 1/2 sum |p - q|.

    1 - TV is exactly the speculative-sampling acceptance probability at the
    training temperature, so the TV term targets acceptance directly; the KL
    term keeps gradients informative where the two distributions are far apart.
    Returns (loss, mean TV).
    """
    logq = F.log_softmax(logits, -1)
    loss = -(soft * logq).sum(-1).mean()
    if tv_weight:
        tv = 0.5 * (soft - logq.exp()).abs().sum(-1).mean()
        loss = loss + tv_weight * tv
    else:
        with torch.no_grad():  # logged only
            tv = 0.5 * (soft - logq.exp()).abs().sum(-1).mean()
    return loss, tv


def train(model, data, minutes: float, peak_lr: float, *, max_steps: int = 10**9,
          teacher=None, tv_weight: float = 0.0, lr_floor: float = 0.1, log_every=100,
          name=""):
    """Cross-entropy training, or distillation when ``teacher`` is given
    (see ``distill_loss``; ``tv_weight`` = 0 is plain forward KL).

    The run lasts ``minutes`` of wall-clock time (or max_steps) and the
    learning-rate schedule follows elapsed time, not steps: on a shared CPU
    the step rate varies a lot, and a step-based schedule would either
    overrun the time budget or end before its learning rate has decayed.
    """
    opt = make_optimizer(model, peak_lr)
    model.train()
    t0, V, budget = time.time(), model.config["vocab_size"], minutes * 60
    step, progress = 0, 0.0
    while progress < 1.0 and step < max_steps:
        x, y = next(data)
        progress = max((time.time() - t0) / budget, step / max_steps)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, progress, peak_lr, floor=lr_floor)
        logits = model(x).view(-1, V)
        ce = F.cross_entropy(logits, y.reshape(-1))
        tv = None
        if teacher is None:
            loss = ce
        else:
            with torch.no_grad():
                soft = F.softmax(teacher(x).view(-1, V), -1)
            loss, tv = distill_loss(logits, soft, tv_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % log_every == 0:
            acc = "" if tv is None else f" accept {1 - tv.item():.4f}"
            print(f"[{name}] step {step} ce {ce.item():.3f} loss {loss.item():.3f}{acc} "
                  f"lr {opt.param_groups[0]['lr']:.2e} {time.time() - t0:.0f}s", flush=True)
        step += 1
    print(f"[{name}] done: {step} steps, {step * x.numel():,} tokens, "
          f"{time.time() - t0:.0f}s", flush=True)
    model.eval()
    return model


@torch.no_grad()
def heldout_ce(model, stream: np.ndarray, seq: int, n_windows: int = 64) -> float:
    starts = np.linspace(0, len(stream) - seq - 1, n_windows).astype(int)
    w = torch.from_numpy(np.stack([stream[s:s + seq + 1] for s in starts]).astype(np.int64))
    total = 0.0
    for i in range(0, n_windows, 16):
        x, y = w[i:i + 16, :-1], w[i:i + 16, 1:]
        total += F.cross_entropy(model(x).flatten(0, 1), y.reshape(-1), reduction="sum").item()
    return total / (n_windows * seq)


def model_config(tok, arch: dict, n_positions: int) -> dict:
    eos = tok.token_to_id(EOS_TOKEN)
    return dict(model_type="gpt2", vocab_size=tok.get_vocab_size(), n_positions=n_positions,
                bos_token_id=eos, eos_token_id=eos, layer_norm_epsilon=1e-5, **arch)


def train_or_load(path, cfg, fit, force):
    model = GPT(cfg)
    if os.path.exists(path) and not force:
        state = torch.load(path)
        mine = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        if {k: tuple(v.shape) for k, v in state.items()} != mine:
            raise SystemExit(f"{path} holds a model of another architecture; "
                             "move it away or pass --force")
        model.load_state_dict(state)
        model.eval()
        return model
    fit(model)
    torch.save(model.state_dict(), path)
    return model


def parse_arch(text: str) -> dict:
    """'LxDxH' (layers x width x heads) -> {n_layer, n_embd, n_head}."""
    n_layer, n_embd, n_head = (int(v) for v in text.lower().split("x"))
    return dict(n_embd=n_embd, n_layer=n_layer, n_head=n_head)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work-dir", default="out/stdlib-code")
    ap.add_argument("--dest", default=DEFAULT_DEST)
    ap.add_argument("--vocab-size", type=int, default=2048)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--target-minutes", type=float, default=17.0)
    ap.add_argument("--draft-minutes", type=float, default=11.0)
    ap.add_argument("--max-steps", type=int, default=10**9, help="cap per model (smoke runs)")
    ap.add_argument("--target-lr", type=float, default=2e-3)
    ap.add_argument("--draft-lr", type=float, default=3e-3)
    ap.add_argument("--draft-arch", default="{n_layer}x{n_embd}x{n_head}".format(**DRAFT),
                    help="draft layers x width x heads")
    ap.add_argument("--tune-minutes", type=float, default=25.0,
                    help="second draft stage, continuing the first; 0 skips it")
    ap.add_argument("--tune-lr", type=float, default=1.5e-3)
    ap.add_argument("--tune-lr-floor", type=float, default=0.05,
                    help="final learning rate of the second stage, as a fraction of --tune-lr")
    ap.add_argument("--tv-weight", type=float, default=1.0,
                    help="second-stage loss = forward KL + this x TV(target, draft)")
    ap.add_argument("--only-draft", action="store_true",
                    help="needs the target checkpoint; trains (or loads) and exports the draft only")
    # One thread by default: with two, any other busy process on a 2-core
    # machine stalls every parallel region and a step gets ~4x slower.
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    os.makedirs(a.work_dir, exist_ok=True)
    redo_shared = a.force and not a.only_draft  # --only-draft --force redoes the draft only
    from tokenizers import Tokenizer

    train_files, held_files = split_files(list_files())
    tok_path = os.path.join(a.work_dir, "tokenizer.json")
    stream_path = os.path.join(a.work_dir, "train_ids.npy")
    if os.path.exists(tok_path) and os.path.exists(stream_path) and not redo_shared:
        tok, stream = Tokenizer.from_file(tok_path), np.load(stream_path)
    else:
        texts = read_texts(train_files)
        tok = train_tokenizer(texts, a.vocab_size)
        tok.save(tok_path)
        stream = encode_stream(tok, texts)
        np.save(stream_path, stream)
    held = encode_stream(tok, read_texts(held_files))
    print(f"train tokens {len(stream):,}  held-out tokens {len(held):,}", flush=True)

    t_cfg = model_config(tok, TARGET, a.seq)
    d_cfg = model_config(tok, parse_arch(a.draft_arch), a.seq)
    if a.only_draft and not os.path.exists(os.path.join(a.work_dir, "target.pt")):
        raise SystemExit(f"--only-draft: no target checkpoint in {a.work_dir}")
    target = train_or_load(
        os.path.join(a.work_dir, "target.pt"), t_cfg,
        lambda m: train(m, batches(stream, a.batch, a.seq, a.seed), a.target_minutes,
                        a.target_lr, max_steps=a.max_steps, name="target"), redo_shared)
    print(f"target: {target.n_params():,} params, held-out CE {heldout_ce(target, held, a.seq):.3f}",
          flush=True)
    for p in target.parameters():
        p.requires_grad_(False)
    draft = train_or_load(
        os.path.join(a.work_dir, "draft.pt"), d_cfg,
        lambda m: train(m, batches(stream, a.batch, a.seq, a.seed + 1), a.draft_minutes,
                        a.draft_lr, max_steps=a.max_steps, teacher=target, name="draft"), a.force)
    print(f"draft: {draft.n_params():,} params, held-out CE {heldout_ce(draft, held, a.seq):.3f}",
          flush=True)
    if a.tune_minutes > 0:
        def tune(m):
            m.load_state_dict(draft.state_dict())
            train(m, batches(stream, a.batch, a.seq, a.seed + 2), a.tune_minutes, a.tune_lr,
                  max_steps=a.max_steps, teacher=target, tv_weight=a.tv_weight,
                  lr_floor=a.tune_lr_floor, name="draft-tune")

        draft = train_or_load(os.path.join(a.work_dir, "draft-tuned.pt"), d_cfg, tune, a.force)
        print(f"tuned draft: held-out CE {heldout_ce(draft, held, a.seq):.3f}", flush=True)

    pairs = [("target", target, t_cfg), ("draft", draft, d_cfg)]
    for name, model, cfg in pairs[1:] if a.only_draft else pairs:
        out = os.path.join(a.dest, name)
        export_decoder(model.numpy_weights(), cfg, out, weight_dtype="float16")
        write_tokenizer(tok, out)
        print(f"exported {out}", flush=True)


if __name__ == "__main__":
    main()
