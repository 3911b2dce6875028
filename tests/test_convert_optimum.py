"""ONNX exports of Hugging Face models (optimum / torch.onnx naming) convert like the checkpoint they
came from: Linear weights found through the nodes that read them (transposed MatMul initializers with
opaque names, Gemm with transB), embeddings, norms and biases by parameter name, external data. The
exports are written here with the onnx helpers from tiny checkpoints; the converted graphs are checked
against the NumPy forward of the original checkpoint."""

import numpy as np
import onnxruntime as ort
import pytest

from helpers_convert import TINY, run_graph
from models import tool_layouts
from models.hf_checkpoint import write_checkpoint
from specsample_cupy.convert import ConversionError, convert
from specsample_cupy.convert.checkpoint import Checkpoint
from specsample_cupy.convert.families import llama_shape
from specsample_cupy.convert.numpy_forward import llama_logits


def optimum_export(hf, dst, **kw):
    """models.tool_layouts.optimum_export with both node forms real exports mix: layer 0's down_proj as
    a Gemm with transB, layer 1's o_proj under a doubled "/model/model" path."""
    return tool_layouts.optimum_export(hf, dst, gemm=("model.layers.0.mlp.down_proj",),
                                       doubled_prefix=("model.layers.1.self_attn.o_proj",), **kw)


@pytest.mark.parametrize("name,external", [("qwen2-tied", False), ("llama2-bias", True), ("mistral", False)])
def test_exports_convert_like_their_checkpoint(tmp_path, name, external):
    config = {**TINY[name], "num_hidden_layers": 2}
    hf = write_checkpoint(tmp_path / "hf", config, dtype="float32", seed=4, embed_scale=0.5)
    out = convert(optimum_export(hf, tmp_path / "export", external=external), tmp_path / "out", dtype="float32")
    ckpt = Checkpoint(hf)
    s = llama_shape(ckpt.config)
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(1).integers(0, s.vocab_size, (2, 7))
    logits, _ = run_graph(session, ids, np.ones((2, 7)), np.tile(np.arange(7), (2, 1)), kv=(s.kv_heads, s.head_dim))
    ref = llama_logits(ckpt.get, s, ids)
    assert np.abs(logits - ref).max() / np.abs(ref).max() < 1e-5
    assert (out / "tokenizer.json").exists()


def test_a_missing_weight_is_named(tmp_path):
    hf = write_checkpoint(tmp_path / "hf", {**TINY["qwen2-tied"], "num_hidden_layers": 2}, dtype="float32", seed=4)
    export = optimum_export(hf, tmp_path / "export", drop="model.layers.1.mlp.up_proj.weight")
    with pytest.raises(ConversionError, match="model.layers.1.mlp.up_proj.weight"):
        convert(export, tmp_path / "out", dtype="float32")


def test_first_load_converts_once_into_the_cache(tmp_path, capsys):
    """What the decoder does on CUDA for an export it cannot capture (decoder_device._open_converted): the cached
    copy decodes as the checkpoint converted directly does, and is written once."""
    from specsample_cupy.convert.cache import converted_copy, convertible
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    hf = write_checkpoint(tmp_path / "hf", {**TINY["qwen2-tied"], "num_hidden_layers": 2}, dtype="float32", seed=4,
                          embed_scale=0.5)
    export = optimum_export(hf, tmp_path / "export")
    assert convertible(export) and not convertible(hf)
    first = converted_copy(export, tmp_path / "cache")
    assert "converted once" in capsys.readouterr().err
    assert converted_copy(export, tmp_path / "cache") == first and capsys.readouterr().err == ""
    direct = convert(hf, tmp_path / "direct", dtype="float32")
    args = dict(max_new_tokens=12, gamma=0, method="target", temperature=0, ignore_eos=True)
    prompts = ["def f(x):", "import os\n"]
    assert SpeculativeDecoder(first, first, device="cpu").generate(prompts, **args).token_ids == \
        SpeculativeDecoder(direct, direct, device="cpu").generate(prompts, **args).token_ids


@pytest.mark.parametrize("dtype,expected", [(np.float16, "float16"), (np.float32, "float32")])
def test_an_exports_dtype_is_its_weights_without_typed_logits(tmp_path, dtype, expected):
    """The cache converts an export in its own precision: its logits' type, or (no typed logits output)
    the dtype most of its weights are stored in."""
    from specsample_cupy.convert.cache import _export_dtype
    hf = write_checkpoint(tmp_path / "hf", TINY["qwen2-tied"], dtype="float32", seed=4)
    export = optimum_export(hf, tmp_path / "export", dtype=dtype)
    assert _export_dtype(export / "model.onnx") == expected
