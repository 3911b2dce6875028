"""Ballast ("cost-realistic") models: same outputs as the embedded pair, ballast not optimized away."""
import json

import numpy as np
import onnx
import pytest

pytest.importorskip("onnxruntime")

from models import build_cost_pair as bcp  # noqa: E402
from models.ort_decoder import OrtDecoder  # noqa: E402

TINY = bcp.BallastSpec(blocks=3, d=64, ffn=128, distinct=2)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("cost")
    return {role: bcp.build_model(bcp.EMBEDDED / role, root / role, TINY, seed=1, check=False)
            for role in ("target", "draft")}  # unchecked: the tests below do the checking


@pytest.mark.parametrize("role", ["target", "draft"])
def test_outputs_bit_identical_prefill_and_step(built, role):
    src, dst = OrtDecoder(str(bcp.EMBEDDED / role)), OrtDecoder(str(built[role]))
    rng = np.random.default_rng(7)
    ids = rng.integers(0, src.config["vocab_size"], (3, 9))
    mask = np.ones((3, 9), np.int64)
    mask[0, :2] = 0  # a left-padded row
    pos = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    (la, pa), (lb, pb) = src(ids, mask, pos), dst(ids, mask, pos)
    np.testing.assert_array_equal(la, lb)
    for a, b in zip(pa, pb, strict=True):
        np.testing.assert_array_equal(a, b)
    step = rng.integers(0, src.config["vocab_size"], (3, 2))  # non-empty past
    mask2 = np.ones((3, 11), np.int64)
    mask2[:, :9] = mask
    pos2 = pos[:, -1:] + np.array([[1, 2]])
    (la, pa), (lb, pb) = src(step, mask2, pos2, pa), dst(step, mask2, pos2, pb)
    np.testing.assert_array_equal(la, lb)
    assert np.all(np.isfinite(lb))
    for a, b in zip(pa, pb, strict=True):
        np.testing.assert_array_equal(a, b)
    assert bcp.check_logits_equal(bcp.EMBEDDED / role, built[role]) == 0.0


def test_graph_holds_ballast_with_allowed_ops(built):
    model = onnx.load(str(built["target"] / "model.onnx"), load_external_data=False)
    ballast = [n for n in model.graph.node if n.name.startswith(bcp.PREFIX)]
    assert {n.op_type for n in ballast} <= {"MatMul", "Add", "Tanh", "LayerNormalization", "Cast"}
    # 1 + K*2 + 1 MatMuls; the distinct W1 sets are shared across blocks
    mm = [n for n in ballast if n.op_type == "MatMul"]
    assert len(mm) == 2 * TINY.blocks + 2
    assert {n.input[1] for n in mm if ".w1." in n.input[1]} == {"ballast.w1.0", "ballast.w1.1"}
    ext = {t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    assert "ballast.w_zero" in ext and "ballast.w1.1" in ext
    size = (built["target"] / bcp.DATA_FILE).stat().st_size
    assert size >= 2 * (2 * 2 * 64 * 128 + 2 * 128 * 64)  # 2 x (W1, W2), W_up, W_zero in fp16


@pytest.mark.parametrize("role", ["target", "draft"])
def test_ballast_nodes_survive_optimization(built, role):
    assert bcp.ballast_nodes_survive(built[role]) == 2 * TINY.blocks + 2
    assert bcp.ballast_nodes_survive(bcp.EMBEDDED / role) == 0


def test_a_nonzero_w_zero_is_detected(built, tmp_path):
    """The equality check must be able to fail: make W_zero nonzero."""
    import shutil
    bad = tmp_path / "bad"
    shutil.copytree(built["draft"], bad)
    model = onnx.load(str(bad / "model.onnx"), load_external_data=False)
    t = next(t for t in model.graph.initializer if t.name == "ballast.w_zero")
    offset = int(next(e.value for e in t.external_data if e.key == "offset"))
    with open(bad / bcp.DATA_FILE, "r+b") as f:
        f.seek(offset)
        f.write(np.full(4, 0.5, np.float16).tobytes())
    with pytest.raises(AssertionError, match="differ"):
        bcp.check_logits_equal(bcp.EMBEDDED / "draft", bad)


@pytest.mark.parametrize("pair,role,gb", [("cost-1.5b", "target", 3.0), ("cost-1.5b", "draft", 1.0),
                                          ("cost-7b", "target", 15.0), ("cost-7b", "draft", 1.0)])
def test_preset_bytes_per_run(pair, role, gb):
    spec = bcp.PAIRS[pair][role]
    d_model = json.loads((bcp.EMBEDDED / role / "config.json").read_text())["n_embd"]
    assert abs(bcp.bytes_per_run(spec, d_model) / 1e9 - gb) <= 0.1 * gb
    assert bcp.distinct_bytes(spec, d_model) >= 200e6  # far beyond a GPU's L2
    assert spec.distinct < spec.blocks  # weight sets are reused, files stay small
    assert bcp.bytes_per_run(TINY, 0) == 2 * (3 * (2 * 64 * 128 + 2 * 64))


def test_build_pair_caches_and_embedded(tmp_path, monkeypatch):
    assert bcp.build_pair("embedded", tmp_path) == (bcp.EMBEDDED / "target", bcp.EMBEDDED / "draft")
    monkeypatch.setitem(bcp.PAIRS, "cost-test", {"target": TINY, "draft": TINY})
    target, draft = bcp.build_pair("cost-test", tmp_path, seed=2)
    assert (target, draft) == (tmp_path / "cost-test" / "target", tmp_path / "cost-test" / "draft")
    manifest = json.loads((tmp_path / "cost-test" / "manifest.json").read_text())
    assert manifest["seed"] == 2 and manifest["format"] == bcp.FORMAT_VERSION
    assert manifest["target"]["spec"] == {"blocks": 3, "d": 64, "ffn": 128, "distinct": 2}
    stamp = (target / "model.onnx").stat().st_mtime_ns
    assert bcp.build_pair("cost-test", tmp_path, seed=2) == (target, draft)
    assert (target / "model.onnx").stat().st_mtime_ns == stamp  # reused, not rebuilt
    bcp.build_pair("cost-test", tmp_path, seed=3)  # another seed: rebuilt
    assert (target / "model.onnx").stat().st_mtime_ns != stamp
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (draft / f).read_bytes() == (bcp.EMBEDDED / "draft" / f).read_bytes()
    with pytest.raises(KeyError):
        bcp.build_pair("no-such-pair", tmp_path)
