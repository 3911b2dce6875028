"""How far each sigmoid method is from exact, on the logit rows of a trained pair (CPU, closed form).

For every position of held-out code (models.loop_acceptance's prompts, extended), the target and the
draft score the same prefix; specsample_cupy/verification/analysis.py gives each method's distribution of
  - the first emitted token of a round (draft proposes x ~ softmax(q / T), then accept/resample),
  - the bonus token (every draft accepted),
and this reports their total-variation distance from the target's softmax(p / T) (0 for exact), the
probability that the draft token is accepted, over all positions: mean, median, 90th percentile.

One more row is a what-if, not a method of the library: "sigmoid, row-max offset" uses offset = the
row's maximum and scale 1 (sigma(z - max) ~ exp(z - max), which the kernel's checks already read),
to show how much of the error constants that track each row would remove.

    python3 benchmarks/sigmoid_fidelity.py [--json benchmarks/results/sigmoid_fidelity.json]
"""
import argparse
import json

import numpy as np

from models.loop_acceptance import heldout_prompts
from specsample_cupy.decode.decoder import default_model_dir
from specsample_cupy.verification.analysis import (bonus_distribution, first_token_distribution, method_weights,
                                                  total_variation)

METHODS = ("exact", "sigmoid", "sigmoid-paper")
ROW_MAX = "sigmoid, row-max offset"


def sequence_logits(model_dir, ids):
    """Logits [S, V] of a decoder-only ONNX export over one whole sequence (empty past)."""
    import onnxruntime as ort
    session = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": ids[None], "attention_mask": np.ones((1, ids.size), np.int64),
             "position_ids": np.arange(ids.size, dtype=np.int64)[None]}
    for i in session.get_inputs():
        if i.name.startswith("past_key_values"):
            feeds[i.name] = np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
    return session.run(["logits"], feeds)[0][0].astype(np.float64)


def _sigmoid_row_max(z, y, temperature):
    """First-token distribution with p~ = sigma(z / T - max), q~ = sigma(y / T - max) (each row its own
    maximum), by the same formula as analysis.first_token_distribution."""
    zt, yt = z / temperature, y / temperature
    pw, qw = 1 / (1 + np.exp(-(zt - zt.max()))), 1 / (1 + np.exp(-(yt - yt.max())))
    q = method_weights(y, "exact", temperature)
    a = np.minimum(1.0, pw / qw)
    r = np.maximum(pw - qw, 0.0)
    r = r if r.sum() > 0 else pw
    return q * a + (1 - (q * a).sum()) * r / r.sum(), float((q * a).sum())


def fidelity(target_rows, draft_rows, temperature):
    """Per method: TV of the first emitted token and of the bonus token from the target, and the
    draft token's acceptance probability, for every row."""
    out = {}
    for method in METHODS:
        first, bonus, accept = [], [], []
        for z, y in zip(target_rows, draft_rows):
            p = method_weights(z, "exact", temperature)
            first.append(total_variation(first_token_distribution(z, y, method, temperature), p))
            bonus.append(total_variation(bonus_distribution(z, method, temperature), p))
            q = method_weights(y, "exact", temperature)
            pw, qw = method_weights(z, method, temperature), method_weights(y, method, temperature)
            with np.errstate(divide="ignore", invalid="ignore"):
                a = np.where(pw > 0, np.minimum(1.0, np.where(qw > 0, pw / qw, np.inf)), 0.0)
            accept.append(float((q * a).sum()))
        out[method] = {name: _summary(v) for name, v in (("tv_first", first), ("tv_bonus", bonus),
                                                         ("acceptance", accept))}
    first, accept = [], []
    for z, y in zip(target_rows, draft_rows):
        dist, acc = _sigmoid_row_max(z, y, temperature)
        first.append(total_variation(dist, method_weights(z, "exact", temperature)))
        accept.append(acc)
    out[ROW_MAX] = {"tv_first": _summary(first), "tv_bonus": _summary([0.0]), "acceptance": _summary(accept)}
    return out


def _summary(values):
    v = np.asarray(values)
    return {"mean": float(v.mean()), "median": float(np.median(v)), "p90": float(np.quantile(v, 0.9))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--temperatures", default="1.0,0.7")
    a = ap.parse_args(argv)
    from tokenizers import Tokenizer
    target_dir, draft_dir = default_model_dir("target"), default_model_dir("draft")
    tok = Tokenizer.from_file(str(target_dir / "tokenizer.json"))
    target_rows, draft_rows = [], []
    for text in heldout_prompts(8, lines=12):
        ids = np.asarray(tok.encode(text).ids, np.int64)
        target_rows.extend(sequence_logits(target_dir, ids)[4:])   # rows after a few tokens of context
        draft_rows.extend(sequence_logits(draft_dir, ids)[4:])
    report = {"pair": "embedded (models/stdlib-code)", "rows": len(target_rows), "results": {}}
    print(f"{len(target_rows)} logit rows of the embedded pair, held-out code")
    print(f"{'T':>4} {'method':>24} {'TV first token mean/median/p90':>32} {'TV bonus token mean':>20} "
          f"{'acceptance mean':>16}")
    for t in (float(x) for x in a.temperatures.split(",")):
        res = report["results"][str(t)] = fidelity(target_rows, draft_rows, t)
        for method, r in res.items():
            f = r["tv_first"]
            print(f"{t:>4} {method:>24} {f['mean']:>12.4f} {f['median']:>8.4f} {f['p90']:>8.4f} "
                  f"{r['tv_bonus']['mean']:>20.4f} {r['acceptance']['mean']:>16.4f}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(report, fh, indent=1)
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
