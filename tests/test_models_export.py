"""The torch-free ONNX decoder export against a numpy reference."""
import json

import numpy as np
import onnx
import pytest

pytest.importorskip("onnxruntime")

from models.export_onnx import export_decoder, random_weights  # noqa: E402
from models.ort_decoder import OrtDecoder  # noqa: E402
from models.reference_forward import reference_logits  # noqa: E402

CFG = dict(model_type="gpt2", vocab_size=37, n_positions=64, n_embd=32, n_layer=2,
           n_head=4, bos_token_id=36, eos_token_id=36, layer_norm_epsilon=1e-5)
ATOL = 1e-4


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    weights = random_weights(CFG, seed=3, scale=0.15, embed_scale=0.5)
    out = tmp_path_factory.mktemp("dec")
    export_decoder(weights, CFG, str(out))
    return weights, OrtDecoder(str(out)), out


def _ids(shape, seed=0):
    return np.random.default_rng(seed).integers(0, CFG["vocab_size"], shape)


def test_files_and_io_names(exported):
    _, _, out = exported
    model = onnx.load(str(out / "model.onnx"))
    ins = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
           for i in model.graph.input}
    outs = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim]
            for o in model.graph.output}
    assert ins["input_ids"] == ["batch_size", "sequence_length"]
    assert ins["attention_mask"] == ["batch_size", "past_sequence_length + sequence_length"]
    assert ins["past_key_values.1.value"] == ["batch_size", 4, "past_sequence_length", 8]
    assert outs["logits"] == ["batch_size", "sequence_length", 37]
    assert outs["present.0.key"] == ["batch_size", 4, "past_sequence_length + sequence_length", 8]
    assert len(ins) == 3 + 2 * CFG["n_layer"] and len(outs) == 1 + 2 * CFG["n_layer"]
    assert {t.data_type for t in model.graph.initializer
            if t.name == "wte"} == {onnx.TensorProto.FLOAT16}
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 36
    assert json.loads((out / "config.json").read_text())["n_embd"] == 32


def test_full_pass_matches_numpy_reference(exported):
    weights, dec, _ = exported
    ids = _ids((3, 20))
    logits, present = dec(ids)
    ref = reference_logits(weights, CFG, ids)
    assert logits.dtype == np.float32 and logits.shape == (3, 20, 37)
    np.testing.assert_allclose(logits, ref, rtol=1e-4, atol=ATOL)
    assert present[0].shape == (3, 4, 20, 8)


@pytest.mark.parametrize("step", [1, 3])
def test_incremental_decoding_matches_full_pass(exported, step):
    _, dec, _ = exported
    ids = _ids((2, 23), seed=1)
    full, full_present = dec(ids)
    logits, past = dec(ids[:, :8])
    chunks = [logits]
    for s in range(8, 23, step):
        logits, past = dec(ids[:, s:s + step], past=past)
        chunks.append(logits)
    np.testing.assert_allclose(np.concatenate(chunks, 1), full, rtol=1e-4, atol=ATOL)
    for a, b in zip(past, full_present):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=ATOL)


def test_masked_hole_equals_cache_without_it(exported):
    _, dec, _ = exported
    ids = _ids((1, 12), seed=2)
    hole = 5
    # Cache with position `hole` masked out; later tokens' positions skip it.
    pos = np.array([[0, 1, 2, 3, 4, 5, 5, 6, 7, 8]])
    mask = np.ones((1, 10), np.int64)
    mask[0, hole] = 0
    _, past = dec(ids[:, :10], attention_mask=mask, position_ids=pos)
    mask_new = np.concatenate([mask, np.ones((1, 2), np.int64)], 1)
    with_hole, _ = dec(ids[:, 10:12], attention_mask=mask_new, position_ids=[[9, 10]], past=past)
    # Same sequence with the token simply absent.
    kept = np.delete(ids[:, :12], hole, axis=1)
    without, _ = dec(kept)
    np.testing.assert_allclose(with_hole, without[:, -2:], rtol=1e-4, atol=ATOL)


def test_left_padded_batch_matches_single_rows(exported):
    _, dec, _ = exported
    lengths = [9, 5, 1]
    T = max(lengths)
    rows = [_ids((1, n), seed=10 + n) for n in lengths]
    ids = np.zeros((3, T), np.int64)
    mask = np.zeros((3, T), np.int64)
    pos = np.ones((3, T), np.int64)  # padding slots: any valid position
    for b, (n, r) in enumerate(zip(lengths, rows)):
        ids[b, T - n:] = r[0]
        mask[b, T - n:] = 1
        pos[b, T - n:] = np.arange(n)
    logits, past = dec(ids, attention_mask=mask, position_ids=pos)
    assert np.isfinite(logits).all()  # fully masked padding rows give no NaN
    nxt = _ids((3, 2), seed=99)
    mask2 = np.concatenate([mask, np.ones((3, 2), np.int64)], 1)
    pos2 = np.array([[n, n + 1] for n in lengths])
    logits2, _ = dec(nxt, attention_mask=mask2, position_ids=pos2, past=past)
    for b, (n, r) in enumerate(zip(lengths, rows)):
        single, _ = dec(np.concatenate([r, nxt[b:b + 1]], 1))
        np.testing.assert_allclose(logits[b, T - n:], single[0, :n], rtol=1e-4, atol=ATOL)
        np.testing.assert_allclose(logits2[b], single[0, n:], rtol=1e-4, atol=ATOL)


def test_float32_weights_and_bad_shapes(tmp_path):
    weights = random_weights(CFG, seed=4)
    export_decoder(weights, CFG, str(tmp_path / "f32"), weight_dtype="float32")
    dec = OrtDecoder(str(tmp_path / "f32"))
    ids = _ids((1, 6))
    np.testing.assert_allclose(dec(ids)[0], reference_logits(weights, CFG, ids, weight_dtype=None),
                               rtol=1e-4, atol=ATOL)
    weights["wpe"] = weights["wpe"][:10]
    with pytest.raises(ValueError):
        export_decoder(weights, CFG, str(tmp_path / "bad"))
