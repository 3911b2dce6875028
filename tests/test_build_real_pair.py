"""models/build_real_pair.py at tiny sizes (the real shapes' configs with small widths): the pair is
written once and reused while its manifest matches, and a self-drafting pair's draft (the target's
first layers) gives the target's logits, so greedy decoding accepts every draft."""
import numpy as np
import onnxruntime as ort
import pytest

from helpers_convert import run_graph
from models import build_real_pair
from models.hf_checkpoint import REAL_SHAPES

TINY_WIDTHS = {"vocab_size": 2100, "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
               "num_key_value_heads": 2, "num_hidden_layers": 6}


@pytest.fixture
def tiny_shapes(monkeypatch):
    shapes = {name: {**config, **TINY_WIDTHS} for name, config in REAL_SHAPES.items()}
    monkeypatch.setattr(build_real_pair, "REAL_SHAPES", shapes)


def _logits(folder, ids):
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    kv = next(i for i in session.get_inputs() if i.name.startswith("past_key_values.")).shape
    positions = np.arange(ids.shape[1])[None]
    return run_graph(session, ids, np.ones_like(ids), positions, kv=(kv[1], kv[3]))[0]


def test_self_pair_draft_gives_the_targets_logits(tiny_shapes, tmp_path):
    target, draft = build_real_pair.build_pair("real-1.5b-self", tmp_path, dtype="float32")
    ids = np.array([[5, 17, 300, 42, 7]])
    np.testing.assert_allclose(_logits(draft, ids), _logits(target, ids), rtol=1e-4, atol=1e-4)
    stamp = (target / "model.onnx").stat().st_mtime_ns
    assert build_real_pair.build_pair("real-1.5b-self", tmp_path, dtype="float32") == (target, draft)
    assert (target / "model.onnx").stat().st_mtime_ns == stamp      # reused, not rebuilt
    assert sorted(p.name for p in (tmp_path / "real-1.5b-self").iterdir()) == ["draft", "manifest.json", "target"]


def test_independent_pair_shares_the_targets_vocabulary(tiny_shapes, tmp_path):
    target, draft = build_real_pair.build_pair("real-1.5b", tmp_path, dtype="float32")
    ids = np.array([[5, 17, 300]])
    assert _logits(draft, ids).shape == _logits(target, ids).shape
