"""The embedded stdlib-code pair: files, size budget, and a quick quality check."""
import json
import os

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from models.evaluate import DEFAULT_PAIR, evaluate_pair, windows  # noqa: E402
from models.stdlib_corpus import HOLDOUT_EVERY, list_files, split_files  # noqa: E402

MODELS_DIR = os.path.dirname(DEFAULT_PAIR)
SIZE_BUDGET = int(2.6e6)

needs_pair = pytest.mark.skipif(not os.path.exists(os.path.join(DEFAULT_PAIR, "draft", "model.onnx")),
                                reason="embedded pair not built")


def test_sliding_windows_score_every_token_once():
    for n in (1, 2, 255, 256, 257, 1000):
        scored = []
        for start, first in windows(n, 256):
            scored += range(first, start + min(256, n - start))
        assert scored == list(range(1, n))


def test_heldout_split_is_by_file_and_deterministic():
    files = list_files()
    train, held = split_files(files)
    assert not set(train) & set(held)
    assert len(held) == (len(files) + HOLDOUT_EVERY - 1) // HOLDOUT_EVERY
    assert not any("site-packages" in f for f in files)


@needs_pair
def test_pair_files_share_tokenizer_and_fit_budget():
    cfgs = {}
    for name in ("target", "draft"):
        d = os.path.join(DEFAULT_PAIR, name)
        for f in ("model.onnx", "config.json", "generation_config.json", "tokenizer.json"):
            assert os.path.exists(os.path.join(d, f)), f
        cfgs[name] = json.load(open(os.path.join(d, "config.json")))
    t, d = cfgs["target"], cfgs["draft"]
    assert t["vocab_size"] == d["vocab_size"] and t["eos_token_id"] == d["eos_token_id"]
    assert open(os.path.join(DEFAULT_PAIR, "target", "tokenizer.json")).read() == \
        open(os.path.join(DEFAULT_PAIR, "draft", "tokenizer.json")).read()
    assert d["n_embd"] * d["n_layer"] < t["n_embd"] * t["n_layer"]
    total = sum(os.path.getsize(os.path.join(root, f))
                for root, dirs, files in os.walk(MODELS_DIR)
                if "__pycache__" not in root for f in files)
    assert total <= SIZE_BUDGET, total


@needs_pair
def test_pair_quality_on_a_heldout_prefix():
    res = evaluate_pair(DEFAULT_PAIR, max_tokens=3000, batch=4)
    assert res["target_ppl_token"] < res["draft_ppl_token"]
    assert res["target_ppl_token"] < 80  # the first held-out files are harder than average
    assert res["acceptance_T1.0"] > 0.45
    assert np.isclose(res["tokens_per_round_T1.0"],
                      sum(res["acceptance_T1.0"] ** k for k in range(5)))
