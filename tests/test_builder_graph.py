"""ONNX Runtime GenAI builder-layout folders (GroupQueryAttention whose total length comes from the
mask's shape, genai_config.json, no config.json), built here from converted graphs with the onnx
helpers: rewritten for fixed bindings (builder_graph.py) they compute what the converted layout does,
and on CUDA they decode on the device loop with CUDA graphs, one prompt per call."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from helpers_convert import TINY
from helpers_decode_gpu import GPU_DECODE
from models.tool_layouts import builder_folder
from specsample_cupy.runtime.builder_graph import TOTAL, for_fixed_bindings, rewrite
from test_convert_decode import PROMPTS, converted_self_pair
from test_convert_gqa import _Buffers


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("builder")
    return converted_self_pair(root, "float16", TINY["qwen2-tied"], attention="gqa"), root


def test_rewrite_matches_the_converted_layout(tmp_path):
    (target, _), root = converted_self_pair(tmp_path, "float32", attention="gqa"), tmp_path
    built = builder_folder(target, root / "built")
    model = onnx.load(str(built / "model.onnx"))
    assert rewrite(model) and not rewrite(model)
    assert TOTAL in {i.name for i in model.graph.input}
    assert all(n.op_type != "Shape" for n in model.graph.node)   # the shape arithmetic is gone
    sessions = [ort.InferenceSession(m, providers=["CPUExecutionProvider"])
                for m in (str(target / "model.onnx"), model.SerializeToString())]
    ids = np.random.default_rng(0).integers(0, 2100, (1, 9))
    outs = []
    for session in sessions:
        shape = session.get_inputs()[3].shape
        cache = _Buffers(session, type("S", (), {"kv_heads": shape[1], "head_dim": shape[3]}), 1, np.float32)
        outs.append([cache.run(ids[:, :6], [0]), cache.run(ids[:, 6:], [6])])
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


def test_rewritten_copy_loads_weights_from_the_source_folder(tmp_path):
    """A builder model with external data (as every real-size one has): the rewritten graph in the
    cache loads its weights from the source folder, and computes what the converted model does."""
    from specsample_cupy.runtime.ort_session import _inference_session
    (target, _) = converted_self_pair(tmp_path, "float32", attention="gqa")
    built = builder_folder(target, tmp_path / "built")
    model = onnx.load(str(built / "model.onnx"))
    onnx.save_model(model, str(built / "model.onnx"), save_as_external_data=True, location="model.onnx.data",
                    size_threshold=1024)   # small constants inline, as the builder writes them
    path, weights = for_fixed_bindings(built / "model.onnx", tmp_path / "cache")
    assert weights == built and not (path.parent / "model.onnx.data").exists()
    sessions = [ort.InferenceSession(str(target / "model.onnx"), providers=["CPUExecutionProvider"]),
                _inference_session(path, "cpu", None, 0, weights_dir=weights)]
    ids = np.random.default_rng(1).integers(0, 2100, (1, 5))
    outs = []
    for session in sessions:
        shape = session.get_inputs()[3].shape
        cache = _Buffers(session, type("S", (), {"kv_heads": shape[1], "head_dim": shape[3]}), 1, np.float32)
        outs.append(cache.run(ids, [0]))
    np.testing.assert_array_equal(*outs)


def test_rewritten_copy_is_cached(tmp_path):
    (target, _) = converted_self_pair(tmp_path, "float32", attention="gqa")
    built = builder_folder(target, tmp_path / "built")
    first, weights = for_fixed_bindings(built / "model.onnx", tmp_path / "cache")
    assert weights == built
    assert first != built / "model.onnx" and first.exists()
    stamp = first.stat().st_mtime_ns
    assert for_fixed_bindings(built / "model.onnx", tmp_path / "cache") == (first, built)
    assert first.stat().st_mtime_ns == stamp
    assert for_fixed_bindings(target / "model.onnx", tmp_path / "cache") == (target / "model.onnx", None)   # nothing to do


@GPU_DECODE[0]
@GPU_DECODE[1]
def test_builder_folders_decode_on_the_device_loop(pair, tmp_path):
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    (target, draft), root = pair
    decoder = SpeculativeDecoder(builder_folder(target, tmp_path / "t"), builder_folder(draft, tmp_path / "d"),
                                 device="cuda")
    args = dict(temperature=0, ignore_eos=True, max_new_tokens=32)
    for prompt in PROMPTS:
        alone = decoder.generate([prompt], gamma=0, method="target", **args)
        spec = decoder.generate([prompt], gamma=4, method="greedy", **args)
        assert spec.token_ids == alone.token_ids
        assert spec.stats["cuda_graphs"] == {"target": True, "draft": True} and spec.stats["loop"] == "device"
        assert spec.stats["acceptance_rate"] == 1.0
