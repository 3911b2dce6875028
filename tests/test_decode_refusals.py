"""Incompatible pairs, unusable exports and impossible requests are refused with a clear ValueError."""
import json
import shutil

import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402

from models.build_tiny import build_tiny_pair  # noqa: E402
from specsample_cupy.decode.decoder import SpeculativeDecoder  # noqa: E402
from specsample_cupy.runtime.model_folder import ModelSpec  # noqa: E402
from specsample_cupy.runtime.ort_session import cuda_available  # noqa: E402
from specsample_cupy.runtime.sessions import DecoderSession  # noqa: E402


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_tiny_pair(str(tmp_path_factory.mktemp("tiny")), vocab_size=16, n_positions=24)


def _with_graph(src, dst, inputs, outputs, nodes, name="model.onnx"):
    """A copy of model directory src whose ONNX file is replaced by the given graph."""
    shutil.copytree(src, dst)
    (dst / "model.onnx").unlink()
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(dst / name))
    return dst


def _tensor(name, elem=TensorProto.FLOAT, shape=("batch", 2, "past", 16)):
    return helper.make_tensor_value_info(name, elem, list(shape))


IDS = _tensor("input_ids", TensorProto.INT64, ("batch", "seq"))
MASK = _tensor("attention_mask", TensorProto.INT64, ("batch", "total"))
LOGITS = _tensor("logits", shape=("batch", "seq", 1))
LOGITS_NODES = [helper.make_node("Cast", ["input_ids"], ["ids_f"], to=TensorProto.FLOAT),
                helper.make_node("Unsqueeze", ["ids_f", "two"], ["logits"])]
TWO = helper.make_node("Constant", [], ["two"], value=helper.make_tensor("v", TensorProto.INT64, [1], [2]))


def test_vocab_sizes_must_match(pair, tmp_path):
    _, other_draft = build_tiny_pair(str(tmp_path), vocab_size=20)
    with pytest.raises(ValueError, match="vocab sizes differ"):
        SpeculativeDecoder(pair[0], other_draft, device="cpu")


def test_tokenizers_must_match(pair, tmp_path):
    draft = shutil.copytree(pair[1], tmp_path / "draft")
    tokenizer = json.loads((draft / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[5:7]
    vocab[a], vocab[b] = vocab[b], vocab[a]   # same size, two tokens swapped
    (draft / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ValueError, match="tokenizers differ"):
        SpeculativeDecoder(pair[0], draft, device="cpu")


def test_export_without_past_is_refused(pair, tmp_path):
    no_past = _with_graph(pair[0], tmp_path / "no_past", [IDS, MASK], [LOGITS], [TWO] + LOGITS_NODES)
    with pytest.raises(ValueError, match="not a decoder-with-past export"):
        DecoderSession(ModelSpec.from_dir(no_past))
    only_decoder = _with_graph(pair[0], tmp_path / "only_decoder", [IDS, MASK], [LOGITS], [TWO] + LOGITS_NODES,
                               name="decoder_model.onnx")
    with pytest.raises(ValueError, match="without past"):
        ModelSpec.from_dir(only_decoder)


def test_missing_inputs_and_outputs_are_refused(pair, tmp_path):
    past = [_tensor("past_key_values.0.key"), _tensor("past_key_values.0.value")]
    present = [_tensor("present.0.key"), _tensor("present.0.value")]
    copies = [helper.make_node("Identity", [f"past_key_values.0.{k}"], [f"present.0.{k}"]) for k in ("key", "value")]
    no_mask = _with_graph(pair[0], tmp_path / "no_mask", [IDS] + past, [LOGITS] + present,
                          [TWO] + LOGITS_NODES + copies)
    with pytest.raises(ValueError, match="lacks the input 'attention_mask'"):
        DecoderSession(ModelSpec.from_dir(no_mask))
    no_present = _with_graph(pair[0], tmp_path / "no_present", [IDS, MASK] + past, [LOGITS] + present[:1],
                             [TWO] + LOGITS_NODES + copies[:1])
    with pytest.raises(ValueError, match="lacks the output 'present.0.value'"):
        DecoderSession(ModelSpec.from_dir(no_present))
    extra = _with_graph(pair[0], tmp_path / "extra", [IDS, MASK, _tensor("token_type_ids", TensorProto.INT64,
                                                                          ("batch", "seq"))] + past,
                        [LOGITS] + present, [TWO] + LOGITS_NODES + copies)
    with pytest.raises(ValueError, match="token_type_ids"):
        DecoderSession(ModelSpec.from_dir(extra))


def test_model_directory_must_hold_model_config_and_tokenizer(pair, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        ModelSpec.from_dir(tmp_path / "nowhere")
    for missing in ("model.onnx", "config.json", "tokenizer.json"):
        d = shutil.copytree(pair[0], tmp_path / missing.replace(".", "_"))
        (d / missing).unlink()
        with pytest.raises(ValueError, match="model.onnx|config.json|tokenizer.json"):
            ModelSpec.from_dir(d)


def test_prompt_longer_than_the_context_is_refused(pair):
    decoder = SpeculativeDecoder(*pair, device="cpu")
    assert decoder.context_length == 24
    with pytest.raises(ValueError, match="context holds 24"):
        decoder.generate(["short", "x" * 30], max_new_tokens=4)


def test_generation_stops_at_the_end_of_the_context(pair):
    decoder = SpeculativeDecoder(*pair, device="cpu")
    prompt = "the rain in spain"   # 17 tokens of a 24-token context
    for method, gamma in (("target", 0), ("greedy", 5), ("exact", 5)):
        out = decoder.generate([prompt, "a"], max_new_tokens=50, gamma=gamma, method=method,
                               temperature=0 if method == "greedy" else 0.5)
        assert len(out.token_ids[0]) <= 24 - 17
        assert len(out.token_ids[1]) <= 24 - 1


def test_bad_arguments(pair):
    decoder = SpeculativeDecoder(*pair, device="cpu")
    with pytest.raises(ValueError, match="method"):
        decoder.generate("a", method="nucleus")
    with pytest.raises(ValueError, match="temperature"):
        decoder.generate("a", temperature=-1.0)
    with pytest.raises(ValueError, match="greedy"):
        decoder.generate("a", method="baseline", temperature=0)
    with pytest.raises(ValueError, match="gamma_min"):
        decoder.generate("a", adaptive_gamma=True, gamma_min=4, gamma_max=2)
    with pytest.raises(ValueError, match="no prompts"):
        decoder.generate([])


@pytest.mark.skipif(cuda_available(), reason="a CUDA device is present")
def test_cuda_without_a_device_is_refused(pair):
    with pytest.raises(RuntimeError, match="CUDA"):
        SpeculativeDecoder(*pair, device="cuda")
    with pytest.warns(RuntimeWarning, match="CPU"):
        assert SpeculativeDecoder(*pair).device == "cpu"
