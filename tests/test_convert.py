"""The checkpoint converter: converted graphs against the NumPy reference forward (prefill, a step with
a past, a cache with a hole), every architecture and storage dtype, and its refusals."""
import json

import numpy as np
import onnxruntime as ort
import pytest

from helpers_convert import TINY, run_graph
from models.hf_checkpoint import write_checkpoint
from specsample_cupy.convert import ConversionError, convert
from specsample_cupy.convert.checkpoint import Checkpoint
from specsample_cupy.convert.families import llama_shape
from specsample_cupy.convert.numpy_forward import llama_logits

# (architecture, checkpoint dtype, shards): bf16 and fp16 storage, sharded and not.
CASES = [("qwen2-tied", "float32", 1), ("llama3-untied", "bfloat16", 3), ("llama2-bias", "float16", 1),
         ("mistral", "bfloat16", 2)]
# Converted float32 graphs follow the float64 reference to float32 rounding; float16 graphs (weights,
# arithmetic, cache in float16) to float16's: error over the largest |logit|.
TOLERANCE = {"float32": 1e-5, "float16": 2e-3}


def _converted(tmp_path, name, ckpt_dtype, shards, dtype):
    hf = write_checkpoint(tmp_path / "hf", TINY[name], dtype=ckpt_dtype, shards=shards, seed=3, embed_scale=0.5)
    out = convert(hf, tmp_path / "out", dtype=dtype)
    ckpt = Checkpoint(hf)
    return ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"]), ckpt, \
        llama_shape(ckpt.config)


def _relative_error(got, ref):
    return float(np.abs(np.asarray(got, np.float64) - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name,ckpt_dtype,shards", CASES)
def test_logits_match_reference(tmp_path, name, ckpt_dtype, shards, dtype):
    session, ckpt, s = _converted(tmp_path, name, ckpt_dtype, shards, dtype)
    rng = np.random.default_rng(0)
    B, S = 2, 6
    ids = rng.integers(0, s.vocab_size, (B, S + 1))
    kv = (s.kv_heads, s.head_dim)
    # Prefill of S tokens, then one step with the past.
    logits, present = run_graph(session, ids[:, :S], np.ones((B, S)), np.tile(np.arange(S), (B, 1)), kv=kv,
                                dtype=np.dtype(dtype))
    ref = llama_logits(ckpt.get, s, ids)
    assert _relative_error(logits, ref[:, :S]) < TOLERANCE[dtype]
    step, _ = run_graph(session, ids[:, S:], np.ones((B, S + 1)), np.full((B, 1), S), past=present)
    assert _relative_error(step, ref[:, S:]) < TOLERANCE[dtype]
    assert step.dtype == np.dtype(dtype) and all(p.dtype == np.dtype(dtype) for p in present.values())


def test_cache_hole_and_left_padding(tmp_path):
    """A masked cache slot and left padding are as if absent, positions skipping them (the decode loops'
    rejected drafts and ragged prompts)."""
    session, ckpt, s = _converted(tmp_path, "llama3-untied", "float32", 1, "float32")
    rng = np.random.default_rng(1)
    ids = rng.integers(0, s.vocab_size, (1, 7))
    mask = np.array([[0, 1, 1, 1, 0, 1, 1]])          # a pad slot, then a hole at slot 4
    positions = np.array([[0, 0, 1, 2, 3, 3, 4]])
    kv = (s.kv_heads, s.head_dim)
    _, present = run_graph(session, ids[:, :5], mask[:, :5], positions[:, :5], kv=kv)
    step, _ = run_graph(session, ids[:, 5:], mask, positions[:, 5:], past=present)
    kept = ids[:, mask[0] == 1]
    ref = llama_logits(ckpt.get, s, kept)[:, -2:]
    assert _relative_error(step, ref) < TOLERANCE["float32"]


def test_llama3_frequencies():
    """Llama 3.1's rope scaling: wavelengths under original / high_freq_factor keep their frequency, over
    original / low_freq_factor are divided by the factor, and the band between interpolates."""
    config = {**TINY["llama3-untied"], "head_dim": 128,
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    s = llama_shape(config)
    base = 1.0 / 500000.0 ** (np.arange(0, 128, 2) / 128)
    wavelen = 2 * np.pi / base
    got = np.asarray(s.inv_freq)
    high, low = wavelen < 8192 / 4, wavelen > 8192
    assert np.array_equal(got[high], base[high]) and np.allclose(got[low], base[low] / 8)
    mid = ~high & ~low
    assert mid.any() and np.all((got[mid] <= base[mid]) & (got[mid] >= base[mid] / 8))


def test_gpt2_checkpoint_gives_the_embedded_model(tmp_path):
    """The embedded target's weights saved as a Hugging Face GPT-2 checkpoint convert back to the same logits."""
    from safetensors.numpy import save_file

    from models.export_onnx import read_weights
    from specsample_cupy.runtime.model_folder import ModelSpec
    spec = ModelSpec.from_dir("models/stdlib-code/target")
    weights = read_weights(str(spec.onnx_path), spec.config)
    hf = tmp_path / "gpt2"
    hf.mkdir()
    save_file({("transformer." + k + (".weight" if k in ("wte", "wpe") else "")): v for k, v in weights.items()},
              str(hf / "model.safetensors"))
    (hf / "config.json").write_text(json.dumps({**spec.config, "architectures": ["GPT2LMHeadModel"]}))
    (hf / "tokenizer.json").write_bytes((spec.model_dir / "tokenizer.json").read_bytes())
    out = convert(hf, tmp_path / "out")
    ids = np.array([[5, 17, 300, 2]])
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.arange(4)[None]}
    for i in range(spec.config["n_layer"]):
        for k in ("key", "value"):
            feeds[f"past_key_values.{i}.{k}"] = np.zeros((1, spec.config["n_head"], 0, 32), np.float32)
    a = ort.InferenceSession(str(spec.onnx_path), providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]
    b = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]
    np.testing.assert_array_equal(a, b)


def _refused(tmp_path, config_change=None, remove=None, match=""):
    hf = write_checkpoint(tmp_path / "hf", {**TINY["qwen2-tied"], **(config_change or {})}, shards=2)
    if remove:
        (hf / remove).unlink()
    with pytest.raises(ConversionError, match=match) as info:
        convert(hf, tmp_path / "out")
    assert "\n" not in str(info.value) and not (tmp_path / "out").exists()


def test_refusals(tmp_path):
    _refused(tmp_path / "a", {"architectures": ["FalconForCausalLM"]}, match="architecture 'FalconForCausalLM'")
    _refused(tmp_path / "b", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, match="rope_scaling type 'yarn'")
    _refused(tmp_path / "c", remove="model-00002-of-00002.safetensors", match="lacks the shard")
    _refused(tmp_path / "d", {"hidden_act": "gelu"}, match="hidden_act")
    _refused(tmp_path / "e", {"mlp_bias": True}, match="mlp_bias")
    _refused(tmp_path / "f", remove="tokenizer.json", match="no tokenizer.json")
    _refused(tmp_path / "g", remove="config.json", match="no config.json")


def test_existing_output_is_kept(tmp_path):
    hf = write_checkpoint(tmp_path / "hf", TINY["mistral"])
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("data")
    with pytest.raises(ConversionError, match="not empty"):
        convert(hf, out)
    assert (out / "keep.txt").read_text() == "data"
    convert(hf, out, overwrite=True)
    assert (out / "model.onnx").exists() and not (out / "keep.txt").exists()


def test_sliding_window_caps_the_context(tmp_path, capsys):
    hf = write_checkpoint(tmp_path / "hf", {**TINY["mistral"], "sliding_window": 128})
    out = convert(hf, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == 128
    assert "sliding-window" in capsys.readouterr().err
