"""A model that ONNX Runtime will not capture as CUDA graphs (a node on the CPU) still runs with fixed
bindings, and so through the device loop, giving the tokens of the same model captured."""
import shutil

import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from specsample_cupy.decode.decoder import SpeculativeDecoder  # noqa: E402

from helpers_decode_gpu import GPU_DECODE, PROMPTS, same_fraction  # noqa: E402


def _with_shape_arithmetic(model):
    """The same logits plus 0 * (the run's new-token count, read from input_ids' shape): the shape
    arithmetic ONNX Runtime places on the CPU, as in optimum's exports, with logits bit-identical."""
    graph = model.graph
    logits = next(o for o in graph.output if o.name == "logits")
    for node in graph.node:
        node.output[:] = ["logits__inner" if o == "logits" else o for o in node.output]
    graph.initializer.extend([helper.make_tensor("shape_one", TensorProto.INT64, [], [1]),
                              helper.make_tensor("shape_zero", TensorProto.FLOAT, [], [0.0])])
    graph.node.extend([
        helper.make_node("Shape", ["input_ids"], ["shape_ids"]),
        helper.make_node("Gather", ["shape_ids", "shape_one"], ["shape_steps"], axis=0),
        helper.make_node("Cast", ["shape_steps"], ["shape_steps_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["shape_steps_f", "shape_zero"], ["shape_nothing"]),
        helper.make_node("Cast", ["shape_nothing"], ["shape_nothing_t"], to=logits.type.tensor_type.elem_type),
        helper.make_node("Add", ["logits__inner", "shape_nothing_t"], ["logits"]),
    ])
    return model


@pytest.fixture(scope="module")
def shaped(pair, tmp_path_factory):
    """The module's pair with shape arithmetic in both graphs."""
    root = tmp_path_factory.mktemp("shaped")
    dirs = []
    for src, role in zip(pair, ("target", "draft")):
        dst = root / role
        shutil.copytree(src, dst)
        onnx.save(_with_shape_arithmetic(onnx.load(str(dst / "model.onnx"))), str(dst / "model.onnx"))
        dirs.append(str(dst))
    return dirs


def test_shape_arithmetic_changes_no_token_on_the_cpu(pair, shaped):
    """The model surgery itself: the same greedy and sampled tokens as the unchanged pair."""
    plain, changed = SpeculativeDecoder(*pair, device="cpu"), SpeculativeDecoder(*shaped, device="cpu")
    for kwargs in (dict(max_new_tokens=24, gamma=3, method="greedy"),
                   dict(max_new_tokens=24, gamma=3, temperature=1.0, seed=4)):
        assert changed.generate(PROMPTS, **kwargs).token_ids == plain.generate(PROMPTS, **kwargs).token_ids


@GPU_DECODE[0]
@GPU_DECODE[1]
def test_a_model_without_cuda_graphs_decodes_on_the_device_loop(pair, shaped):
    from specsample_cupy.runtime.sessions_static import StaticDecoderSession
    captured = SpeculativeDecoder(*pair, device="cuda")
    uncaptured = SpeculativeDecoder(*shaped, device="cuda")
    for role in ("target", "draft"):
        session = getattr(uncaptured, role)
        assert isinstance(uncaptured.cuda_graphs[role], str), uncaptured.cuda_graphs   # capture refused
        assert isinstance(session, StaticDecoderSession) and not session.capture
    expected = captured.generate(PROMPTS, max_new_tokens=40, method="target", temperature=0).token_ids
    for gamma in (0, 3, "auto"):
        out = uncaptured.generate(PROMPTS, max_new_tokens=40, gamma=gamma, method="greedy" if gamma else "target",
                                  temperature=0)
        assert out.stats["loop"] == "device", out.stats["device_rounds"]
        assert out.token_ids == expected, gamma
    assert uncaptured.target.graph_steps == 0 and uncaptured.draft.graph_steps == 0
    sampled = dict(max_new_tokens=32, gamma=4, method="exact", temperature=0.9, seed=5, ignore_eos=True)
    a = captured.generate(PROMPTS * 4, **sampled).token_ids
    b = uncaptured.generate(PROMPTS * 4, **sampled).token_ids
    assert same_fraction(a, b) >= 0.75   # the same numbers; a float near-tie may flip a request
    assert all(len(x) == 32 for x in b)
