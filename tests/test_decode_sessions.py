"""Decoder sessions and their KV cache: rollback, compaction, optimum's merged layout, fp16 I/O."""
import shutil

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402

from models.build_tiny import build_tiny_pair  # noqa: E402
from models.ort_decoder import OrtDecoder  # noqa: E402
from specsample_cupy.decode.decoder import SpeculativeDecoder  # noqa: E402
from specsample_cupy.runtime.model_folder import ModelSpec  # noqa: E402
from specsample_cupy.runtime.sessions import DecoderSession  # noqa: E402

PROMPTS = ["the rain in spain", "a", "hello there"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_tiny_pair(str(tmp_path_factory.mktemp("tiny")), vocab_size=40, seed=2)


def _copy_model_dir(src, dst, onnx_model=None, name="model.onnx"):
    shutil.copytree(src, dst)
    if onnx_model is not None:
        (dst / "model.onnx").unlink()
        onnx.save(onnx_model, str(dst / name))
    return dst


@pytest.mark.parametrize("slack", [0, 1000])
def test_logits_after_rollback_equal_a_fresh_recompute(pair, slack):
    """Feed ragged rows, roll back to random lengths, feed on: every step's logits must equal a cache-free
    pass over exactly the kept tokens (holes left by rollback, or compaction, change nothing)."""
    session = DecoderSession(ModelSpec.from_dir(pair[0]))
    reference = OrtDecoder(pair[0])
    rng = np.random.default_rng(0)
    vocab = session.vocab_size
    seqs = [list(rng.integers(1, vocab, n)) for n in (3, 7, 1)]
    batch = len(seqs)
    cache = session.new_cache(batch, capacity=80, slack=slack)
    n_fed = np.zeros(batch, np.int64)
    for step in range(8):
        # Feed every row its unfed tokens plus 1-4 random extra tokens, right-aligned; some rows skip a step.
        extra = [list(rng.integers(1, vocab, rng.integers(1, 5))) for _ in range(batch)]
        feed_rows = rng.random(batch) < 0.8 if step else np.ones(batch, bool)
        pending = [s[n:] + e if f else [] for s, n, e, f in zip(seqs, n_fed, extra, feed_rows)]
        width = max(len(p) for p in pending)
        ids = np.zeros((batch, width), np.int64)
        mask = np.zeros((batch, width), bool)
        positions = np.zeros((batch, width), np.int64)
        for b, p in enumerate(pending):
            if p:
                ids[b, width - len(p):] = p
                mask[b, width - len(p):] = True
                positions[b, width - len(p):] = n_fed[b] + np.arange(len(p))
        logits = session.forward(cache, ids, mask, positions)
        for b, p in enumerate(pending):
            if p:
                fed = seqs[b][:n_fed[b]] + p
                expected = reference(np.array([fed]))[0][0, -1]
                np.testing.assert_allclose(logits[b, -1], expected, rtol=1e-4, atol=1e-4)
                n_fed[b] = len(fed)
                seqs[b] = fed
        # Roll back: keep a random prefix of what each row has seen (at least one token).
        keep = np.array([rng.integers(1, n + 1) for n in n_fed])
        cache.rollback(keep)
        seqs = [s[:k] for s, k in zip(seqs, keep)]
        n_fed = keep.copy()
        assert (cache.n_real == keep).all()
    assert (cache.compactions > 0) == (slack == 0)


def test_compaction_keeps_real_slots_in_order(pair):
    session = DecoderSession(ModelSpec.from_dir(pair[0]))
    cache = session.new_cache(2, capacity=16, slack=1000)
    ids = np.arange(1, 11).reshape(2, 5)
    mask = np.array([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]], bool)
    session.forward(cache, ids, mask, np.cumsum(mask, 1) - 1)
    before = [t.copy() for t in cache.past()]
    cache.rollback(np.array([2, 4]))
    cache.compact()
    assert cache.length == 4
    assert cache.mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    for old, new in zip(before, cache.past()):
        np.testing.assert_array_equal(new[0, :, 2:], old[0, :, 1:3])
        np.testing.assert_array_equal(new[1], old[1, :, :4])


def test_cache_capacity_is_enforced(pair):
    session = DecoderSession(ModelSpec.from_dir(pair[0]))
    cache = session.new_cache(1, capacity=4)
    session.forward(cache, np.ones((1, 3), np.int64), np.ones((1, 3), bool), np.arange(3)[None])
    with pytest.raises(RuntimeError, match="KV cache full"):
        session.forward(cache, np.ones((1, 2), np.int64), np.ones((1, 2), bool), np.arange(3, 5)[None])


def _merged_model(model):
    """optimum's decoder_model_merged layout: an If on use_cache_branch; the no-past branch ignores the past
    (reads it sliced to length 0), so feeding the wrong branch value gives wrong logits."""
    graph = model.graph
    graph_inputs = {i.name for i in graph.input}

    def branch(tag, drop_past):
        rename = {}
        for node in graph.node:
            for out in node.output:
                rename[out] = f"{out}__{tag}"
        for init in graph.initializer:
            rename[init.name] = f"{init.name}__{tag}"
        nodes, inits = [], []
        for init in graph.initializer:
            copy = onnx.TensorProto()
            copy.CopyFrom(init)
            copy.name = rename[init.name]
            inits.append(copy)
        if drop_past:
            zero = helper.make_tensor(f"zero__{tag}", TensorProto.INT64, [1], [0])
            axis = helper.make_tensor(f"axis__{tag}", TensorProto.INT64, [1], [2])
            inits += [zero, axis]
            for name in graph_inputs:
                if name.startswith("past_key_values"):
                    rename[name] = f"{name}__{tag}_empty"
                    nodes.append(helper.make_node("Slice", [name, zero.name, zero.name, axis.name],
                                                  [rename[name]]))
        for node in graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = f"{node.name}__{tag}"
            copy.input[:] = [rename.get(i, i) for i in node.input]
            copy.output[:] = [rename[o] for o in node.output]
            nodes.append(copy)
        outputs = []
        for out in graph.output:
            info = onnx.ValueInfoProto()
            info.CopyFrom(out)
            info.name = rename[out.name]
            outputs.append(info)
        return helper.make_graph(nodes, f"branch_{tag}", [], outputs, initializer=inits)

    if_node = helper.make_node("If", ["use_cache_branch"], [o.name for o in graph.output], name="optimum::if",
                               then_branch=branch("with_past", False), else_branch=branch("no_past", True))
    inputs = list(graph.input) + [helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1])]
    merged = helper.make_graph([if_node], "merged", inputs, list(graph.output))
    out = helper.make_model(merged, opset_imports=list(model.opset_import))
    out.ir_version = model.ir_version
    return out


def test_merged_decoder_layout(pair, tmp_path):
    dirs = [_copy_model_dir(d, tmp_path / role, _merged_model(onnx.load(f"{d}/model.onnx")),
                            name="decoder_model_merged.onnx")
            for d, role in zip(pair, ("target", "draft"))]
    merged = SpeculativeDecoder(*dirs, device="cpu")
    assert merged.target.has_cache_branch and merged.draft.has_cache_branch
    plain = SpeculativeDecoder(*pair, device="cpu")
    expected = plain.generate(PROMPTS, max_new_tokens=24, method="target", temperature=0).token_ids
    assert merged.generate(PROMPTS, max_new_tokens=24, method="target", temperature=0).token_ids == expected
    assert merged.generate(PROMPTS, max_new_tokens=24, gamma=3, method="greedy").token_ids == expected


def _fp16_io_model(model):
    """The same decoder with float16 past/present/logits tensors (computing in float32 inside)."""
    graph = model.graph
    fp16_inputs = {i.name for i in graph.input if i.type.tensor_type.elem_type == TensorProto.FLOAT}
    fp16_outputs = {o.name for o in graph.output}
    renamed = fp16_inputs | fp16_outputs
    for node in graph.node:
        node.input[:] = [f"{i}__f32" if i in renamed else i for i in node.input]
        node.output[:] = [f"{o}__f32" if o in fp16_outputs else o for o in node.output]
    casts = [helper.make_node("Cast", [n], [f"{n}__f32"], to=TensorProto.FLOAT) for n in sorted(fp16_inputs)]
    casts += [helper.make_node("Cast", [f"{n}__f32"], [n], to=TensorProto.FLOAT16) for n in sorted(fp16_outputs)]
    nodes = casts[:len(fp16_inputs)] + list(graph.node) + casts[len(fp16_inputs):]
    del graph.node[:]
    graph.node.extend(nodes)
    for value in list(graph.input) + list(graph.output):
        if value.name in fp16_inputs | fp16_outputs:
            value.type.tensor_type.elem_type = TensorProto.FLOAT16
    return model


def test_float16_models(pair, tmp_path):
    dirs = [_copy_model_dir(d, tmp_path / role, _fp16_io_model(onnx.load(f"{d}/model.onnx")))
            for d, role in zip(pair, ("target", "draft"))]
    decoder = SpeculativeDecoder(*dirs, device="cpu")
    assert decoder.target.kv_dtype == np.float16 and decoder.target.logits_dtype == np.float16
    expected = decoder.generate(PROMPTS, max_new_tokens=24, method="target", temperature=0).token_ids
    assert decoder.generate(PROMPTS, max_new_tokens=24, gamma=4, method="greedy").token_ids == expected
    out = decoder.generate(PROMPTS, max_new_tokens=24, gamma=4, temperature=1.0, seed=3)
    assert all(len(ids) > 0 for ids in out.token_ids)


def _without_position_ids(model):
    """The decoder numbering new tokens past, past+1, ... by cache column, as older GPT-2 exports do."""
    graph = model.graph
    kept = [i for i in graph.input if i.name != "position_ids"]
    del graph.input[:]
    graph.input.extend(kept)
    const = lambda name, v: helper.make_node("Constant", [], [name],  # noqa: E731
                                             value=helper.make_tensor(name, TensorProto.INT64, [], [v]))
    nodes = [
        const("pos_one", 1),
        helper.make_node("Shape", ["input_ids"], ["pos_ids_shape"]),
        helper.make_node("Gather", ["pos_ids_shape", "pos_one"], ["pos_seq"], axis=0),
        helper.make_node("Shape", ["attention_mask"], ["pos_mask_shape"]),
        helper.make_node("Gather", ["pos_mask_shape", "pos_one"], ["pos_total"], axis=0),
        helper.make_node("Sub", ["pos_total", "pos_seq"], ["pos_past"]),
        helper.make_node("Range", ["pos_past", "pos_total", "pos_one"], ["pos_range"]),
        helper.make_node("Unsqueeze", ["pos_range", "pos_axes"], ["position_ids"]),
    ]
    axes = helper.make_tensor("pos_axes", TensorProto.INT64, [1], [0])
    graph.initializer.append(axes)
    existing = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes + existing)
    return model


def test_models_without_position_ids_decode_one_request_at_a_time(pair, tmp_path):
    dirs = [_copy_model_dir(d, tmp_path / role, _without_position_ids(onnx.load(f"{d}/model.onnx")))
            for d, role in zip(pair, ("target", "draft"))]
    decoder = SpeculativeDecoder(*dirs, device="cpu")
    assert not decoder.target.has_position_ids
    plain = SpeculativeDecoder(*pair, device="cpu")
    for prompt in PROMPTS:
        expected = plain.generate(prompt, max_new_tokens=30, method="target", temperature=0).token_ids
        assert decoder.generate(prompt, max_new_tokens=30, method="target", temperature=0).token_ids == expected
        assert decoder.generate(prompt, max_new_tokens=30, gamma=4, method="greedy").token_ids == expected
        sampled = dict(max_new_tokens=30, gamma=3, temperature=1.0, seed=9)
        assert decoder.generate(prompt, **sampled).token_ids == plain.generate(prompt, **sampled).token_ids
    batch = decoder.generate(PROMPTS, max_new_tokens=12, gamma=3, temperature=1.0, seed=9)   # prompt by prompt
    assert batch.stats["one_prompt_at_a_time"] and batch.stats["batch"] == len(PROMPTS)
    assert batch.token_ids == plain.generate(PROMPTS, max_new_tokens=12, gamma=3, temperature=1.0, seed=9).token_ids
