"""ONNX Runtime GenAI builder folders convert like the checkpoint they came from: weights under the
builder's node names (packed or separate q/k/v, all-zero biases left out, the embedding tied to lm_head
or not), the rotary tables the folder holds, config.json made from genai_config.json and the graph. The
folders are written here with the onnx helpers from tiny checkpoints (models/tool_layouts.py); the
converted graphs are checked against the NumPy forward of the original checkpoint."""
import json

import numpy as np
import onnxruntime as ort
import pytest

from helpers_convert import TINY, run_graph
from models.hf_checkpoint import write_checkpoint
from models.tool_layouts import builder_export
from specsample_cupy.convert import ConversionError, convert, open_checkpoint
from specsample_cupy.convert.checkpoint import Checkpoint
from specsample_cupy.convert.families import llama_shape
from specsample_cupy.convert.numpy_forward import llama_logits


def _logits(out, s, ids):
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    B, S = ids.shape
    logits, _ = run_graph(session, ids, np.ones((B, S)), np.tile(np.arange(S), (B, 1)), kv=(s.kv_heads, s.head_dim))
    return logits


@pytest.mark.parametrize("name,packed,tied,weights,tolerance", [
    ("qwen2-tied", True, True, "float32", 1e-5),
    ("llama3-untied", False, False, "float32", 1e-5),
    ("llama2-bias", True, False, "float32", 1e-5),
    ("mistral", True, False, "float16", 2e-3),
])
def test_builder_folders_convert_like_their_checkpoint(tmp_path, name, packed, tied, weights, tolerance):
    config = {**TINY[name], "num_hidden_layers": 2}
    hf = write_checkpoint(tmp_path / "hf", config, dtype=weights, seed=4, embed_scale=0.5)
    folder = builder_export(hf, tmp_path / "builder", dtype=np.dtype(weights), packed=packed, tied=tied)
    assert not (folder / "config.json").exists()
    out = convert(folder, tmp_path / "out", dtype="float32")
    ref_ckpt = Checkpoint(hf)
    s = llama_shape(ref_ckpt.config)
    ids = np.random.default_rng(1).integers(0, s.vocab_size, (2, 9))
    ref = llama_logits(ref_ckpt.get, s, ids)
    assert np.abs(_logits(out, s, ids) - ref).max() / np.abs(ref).max() < tolerance
    converted = json.loads((out / "config.json").read_text())
    assert converted["architectures"] == config["architectures"] and converted["eos_token_id"] == [0]
    assert (out / "tokenizer.json").exists()
    # What the config would say of the rotary embedding, recovered from the folder's tables.
    builder = open_checkpoint(folder)
    np.testing.assert_allclose(builder.inv_freq(s), s.inv_freq, rtol=2e-3 if weights == "float16" else 1e-5)


def test_a_converted_builder_folder_decodes_batches_as_its_checkpoint_does(tmp_path):
    """The builder's own graph decodes one prompt per call (decode/one_at_a_time.py); converted, a
    ragged batch decodes in one call, token for token as the checkpoint converted directly."""
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    hf = write_checkpoint(tmp_path / "hf", {**TINY["qwen2-tied"], "num_hidden_layers": 2}, dtype="float32", seed=4,
                          embed_scale=0.5)
    via_builder = convert(builder_export(hf, tmp_path / "builder"), tmp_path / "out", dtype="float32")
    direct = convert(hf, tmp_path / "direct", dtype="float32")
    args = dict(max_new_tokens=12, gamma=3, method="greedy", ignore_eos=True)
    prompts = ["def f(x):", "import os\nimport sys\n"]
    out = SpeculativeDecoder(via_builder, via_builder, device="cpu").generate(prompts, **args)
    assert not out.stats.get("one_prompt_at_a_time")
    assert out.token_ids == SpeculativeDecoder(direct, direct, device="cpu").generate(prompts, **args).token_ids


def test_a_sliding_window_caps_the_context(tmp_path):
    hf = write_checkpoint(tmp_path / "hf", {**TINY["mistral"], "num_hidden_layers": 1}, dtype="float32", seed=4)
    out = convert(builder_export(hf, tmp_path / "builder", window=64), tmp_path / "out", dtype="float32")
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == 64


def _refused(tmp_path, match, name="qwen2-tied", genai=None, **export):
    hf = write_checkpoint(tmp_path / "hf", {**TINY[name], "num_hidden_layers": 1}, dtype="float32", seed=4)
    folder = builder_export(hf, tmp_path / "builder", **export)
    if genai is not None:
        path = folder / "genai_config.json"
        path.write_text(json.dumps(genai(json.loads(path.read_text()))))
    with pytest.raises(ConversionError, match=match):
        convert(folder, tmp_path / "out", dtype="float32")
    assert not (tmp_path / "out").exists()


def test_refusals_name_what_they_cannot_write(tmp_path):
    s = llama_shape({**TINY["qwen2-tied"], "num_hidden_layers": 1})
    angles = np.arange(s.context)[:, None] * np.asarray(s.inv_freq)[None, :]
    cases = [
        (dict(quantized=True), "quantized weights \\(MatMulNBits\\)"),
        (dict(drop="model.layers.0.mlp.up_proj.MatMul.weight"), "model.layers.0.mlp.up_proj.MatMul.weight"),
        (dict(drop="model.embed_tokens.weight"), "model.embed_tokens.weight"),   # inputs_embeds
        (dict(rotary=(np.cos(angles[:, :4]), np.sin(angles[:, :4]))), "partial rotary"),
        (dict(rotary=(1.2 * np.cos(angles), 1.2 * np.sin(angles))), "mscale"),
        (dict(genai=lambda g: {**g, "model": {**g["model"], "type": "gemma"}}), "model type 'gemma'"),
        (dict(genai=lambda g: {**g, "model": {**g["model"], "decoder": {**g["model"]["decoder"],
                                                                        "num_hidden_layers": 2}}}),
         "num_hidden_layers = 2 but model.onnx has 1 layers"),
        (dict(genai=lambda g: {**g, "model": {**g["model"], "decoder": {**g["model"]["decoder"],
                                                                        "num_key_value_heads": 4}}}),
         "the config implies"),
        (dict(genai=lambda g: {**g, "model": {**g["model"], "decoder": {**g["model"]["decoder"],
                                                                        "filename": "other.onnx"}}}), "other.onnx"),
    ]
    for k, (export, match) in enumerate(cases):
        _refused(tmp_path / str(k), match, **export)


def test_the_command_converts_a_folder_or_says_why_not_in_one_line(tmp_path):
    """`specsample convert BUILDER_DIR OUT_DIR`: "wrote OUT_DIR", or exit 1 with one line on stderr."""
    from cli import main
    from helpers_cli import split_runner
    hf = write_checkpoint(tmp_path / "hf", {**TINY["qwen2-tied"], "num_hidden_layers": 1}, dtype="float32", seed=4)
    good = builder_export(hf, tmp_path / "good")
    result = split_runner().invoke(main, ["convert", str(good), str(tmp_path / "out"), "--dtype", "float32"])
    assert result.exit_code == 0 and result.stdout.strip() == f"wrote {tmp_path / 'out'}"
    assert (tmp_path / "out" / "model.onnx").exists()
    bad = builder_export(hf, tmp_path / "bad", quantized=True)
    result = split_runner().invoke(main, ["convert", str(bad), str(tmp_path / "out2")])
    assert result.exit_code == 1 and not (tmp_path / "out2").exists()
    assert len(result.stderr.strip().splitlines()) == 1 and "MatMulNBits" in result.stderr
