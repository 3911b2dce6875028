"""Measure the shipped stdlib-code pair on the held-out stdlib files.

    python -m models.evaluate [--pair models/stdlib-code] [--draft DIR] [--max-tokens N]

Runs the exported ONNX files with ONNX Runtime (so the numbers describe
what ships) over the held-out files (see ``models.stdlib_corpus``), joined
into one stream with EOS between documents like the training data, scored
with sliding windows of n_positions tokens (stride n_positions/2, so every
scored token sees at least half a window of context).

Reported, over every non-EOS target token:
  * perplexity per token, and per UTF-8 byte (exp(total NLL / total bytes)),
  * expected acceptance alpha = mean over positions of sum_x min(p(x), q(x)),
    p = target, q = draft, both softmaxed at temperature T; this is exactly the
    probability that speculative sampling accepts a drafted token,
  * expected tokens per round for gamma drafted tokens, (1 - a^(g+1)) / (1 - a),
  * greedy agreement: how often both argmaxes coincide (temperature 0).
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

from .ort_decoder import OrtDecoder
from .stdlib_corpus import EOS_TOKEN, list_files, read_texts, split_files

DEFAULT_PAIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stdlib-code")
TEMPERATURES = (1.0, 0.7)


def heldout_stream(tokenizer) -> tuple[np.ndarray, int]:
    """(token stream [EOS doc EOS doc ...], total UTF-8 bytes of the documents)."""
    texts = read_texts(split_files(list_files())[1])
    eos = tokenizer.token_to_id(EOS_TOKEN)
    ids = [eos]
    for enc in tokenizer.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.array(ids[:-1], np.int64), sum(len(t.encode("utf-8")) for t in texts)


def windows(n_tokens: int, width: int):
    """(start, first scored target index) of sliding windows covering 1..n_tokens-1."""
    stride = width // 2
    start, scored = 0, 1
    while scored < n_tokens:
        yield start, scored
        scored = start + width
        start = max(0, scored - width + stride)
        start = min(start, max(0, n_tokens - width))


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def evaluate_pair(pair_dir: str, *, max_tokens: int | None = None, gamma: int = 4,
                  batch: int = 8, threads: int = 0, draft_dir: str | None = None) -> dict:
    """``draft_dir`` replaces ``pair_dir/draft`` (to measure a candidate draft)."""
    from tokenizers import Tokenizer

    target = OrtDecoder(os.path.join(pair_dir, "target"), threads=threads)
    draft = OrtDecoder(draft_dir or os.path.join(pair_dir, "draft"), threads=threads)
    tok = Tokenizer.from_file(os.path.join(pair_dir, "target", "tokenizer.json"))
    eos = tok.token_to_id(EOS_TOKEN)
    stream, n_bytes = heldout_stream(tok)
    if max_tokens and len(stream) > max_tokens:
        # Keep whole documents' byte count honest: bytes scale with the kept fraction.
        n_bytes = int(n_bytes * max_tokens / len(stream))
        stream = stream[:max_tokens]
    width = min(target.config["n_positions"], draft.config["n_positions"])

    nll = {"target": 0.0, "draft": 0.0}
    acc = {t: 0.0 for t in TEMPERATURES}
    agree, count = 0, 0
    spans = list(windows(len(stream), width))
    for b in range(0, len(spans), batch):
        chunk = spans[b:b + batch]
        n = min(width, len(stream) - chunk[0][0])
        if any(len(stream) - s < n for s, _ in chunk):
            chunk = chunk[:1]  # only the last window can be short
            n = min(width, len(stream) - chunk[0][0])
        ids = np.stack([stream[s:s + n] for s, _ in chunk])
        lt, ld = target(ids)[0].astype(np.float64), draft(ids)[0].astype(np.float64)
        for row, (s, first) in enumerate(chunk):
            lo = first - s - 1  # logits index that predicts stream[first]
            pos = np.arange(lo, n - 1)
            y = stream[s + pos + 1]
            keep = y != eos
            pos, y = pos[keep], y[keep]
            t_rows, d_rows = lt[row, pos], ld[row, pos]
            lp_t, lp_d = _log_softmax(t_rows), _log_softmax(d_rows)
            nll["target"] -= lp_t[np.arange(len(y)), y].sum()
            nll["draft"] -= lp_d[np.arange(len(y)), y].sum()
            for temp in TEMPERATURES:
                p = np.exp(_log_softmax(t_rows / temp))
                q = np.exp(_log_softmax(d_rows / temp))
                acc[temp] += np.minimum(p, q).sum(-1).sum()
            agree += int((t_rows.argmax(-1) == d_rows.argmax(-1)).sum())
            count += len(y)

    res = {"tokens": count, "bytes": n_bytes, "gamma": gamma}
    for m in ("target", "draft"):
        res[f"{m}_ppl_token"] = float(np.exp(nll[m] / count))
        res[f"{m}_ppl_byte"] = float(np.exp(nll[m] / n_bytes))
        res[f"{m}_bits_per_byte"] = float(nll[m] / n_bytes / np.log(2))
    for temp in TEMPERATURES:
        a = acc[temp] / count
        res[f"acceptance_T{temp}"] = float(a)
        res[f"tokens_per_round_T{temp}"] = float((1 - a ** (gamma + 1)) / (1 - a))
    res["greedy_agreement"] = agree / count
    return res


def markdown(res: dict) -> str:
    g = res["gamma"]
    lines = ["| metric | target | draft |", "|---|---|---|",
             f"| perplexity per token | {res['target_ppl_token']:.3f} | {res['draft_ppl_token']:.3f} |",
             f"| perplexity per byte | {res['target_ppl_byte']:.4f} | {res['draft_ppl_byte']:.4f} |",
             f"| bits per byte | {res['target_bits_per_byte']:.4f} | {res['draft_bits_per_byte']:.4f} |",
             "", "| pair metric | value |", "|---|---|"]
    for temp in TEMPERATURES:
        lines.append(f"| expected acceptance, T={temp} | {res[f'acceptance_T{temp}']:.4f} |")
        lines.append(f"| expected tokens per round, gamma={g}, T={temp} | "
                     f"{res[f'tokens_per_round_T{temp}']:.3f} |")
    lines.append(f"| greedy (T=0) agreement | {res['greedy_agreement']:.4f} |")
    lines.append(f"| scored tokens / bytes | {res['tokens']:,} / {res['bytes']:,} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default=DEFAULT_PAIR, help="folder holding target/ and draft/")
    ap.add_argument("--draft", help="draft folder to use instead of PAIR/draft")
    ap.add_argument("--max-tokens", type=int, default=None, help="evaluate a prefix only")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", help="also write the numbers to this file")
    a = ap.parse_args(argv)
    res = evaluate_pair(a.pair, max_tokens=a.max_tokens, gamma=a.gamma, threads=a.threads,
                        draft_dir=a.draft)
    print(markdown(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
