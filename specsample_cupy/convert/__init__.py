"""Hugging Face checkpoints into the project's decoder format, without torch.

    from specsample_cupy.convert import convert
    convert("Qwen2.5-1.5B-Instruct/", "qwen-1.5b-onnx/")                # float16, for CUDA
    convert("Qwen2.5-1.5B-Instruct/", "qwen-1.5b-cpu/", dtype="float32")   # for the CPU

Reads config.json, model.safetensors (or the shards of model.safetensors.index.json) or, in a
folder without them, an ONNX export's weights (ONNX Runtime GenAI's builder:
convert/builder_checkpoint.py; optimum: convert/onnx_checkpoint.py), tokenizer.json and
generation_config.json; writes model.onnx (+ model.onnx.data above 1 GB of weights), config.json,
tokenizer files and generation_config.json. Architectures:
LlamaForCausalLM (Llama 2, 3, 3.1/3.2 with llama3 rope scaling), Qwen2ForCausalLM,
MistralForCausalLM (llama_graph.py) and GPT2LMHeadModel (models/export_onnx.py's graph).
The output runs on the device loop with every run captured as a CUDA graph.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from specsample_cupy.convert.checkpoint import Checkpoint, ConversionError, TensorFolder
from specsample_cupy.convert.families import ATTENTION, llama_shape

DTYPES = ("float16", "float32")
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")
FORMAT_VERSION = 1

__all__ = ["convert", "ConversionError", "DTYPES"]


def _weight_bytes(s, itemsize: int) -> int:
    per_layer = s.hidden * (s.heads + 2 * s.kv_heads) * s.head_dim + s.heads * s.head_dim * s.hidden \
        + 3 * s.hidden * s.intermediate
    return itemsize * (s.layers * per_layer + s.vocab_size * s.hidden * (1 if s.tied else 2))


def open_checkpoint(folder) -> TensorFolder:
    """The safetensors checkpoint in `folder`; where the folder has no safetensors, an ONNX Runtime
    GenAI builder folder (builder_checkpoint.py) or an optimum export (onnx_checkpoint.py)."""
    from specsample_cupy.convert.builder_checkpoint import BuilderCheckpoint, is_builder_folder
    from specsample_cupy.convert.onnx_checkpoint import OnnxCheckpoint, onnx_file

    path = Path(folder)
    has_safetensors = (path / "model.safetensors").exists() or (path / "model.safetensors.index.json").exists()
    if not has_safetensors and path.is_dir() and is_builder_folder(path):
        return BuilderCheckpoint(path)
    if not has_safetensors and path.is_dir() and onnx_file(path) is not None:
        return OnnxCheckpoint(path)
    return Checkpoint(path)


def _write_llama(ckpt: TensorFolder, out: Path, dtype: str, attention: str) -> dict:
    import onnx

    from specsample_cupy.convert.graph import INLINE_LIMIT, ExternalData, GraphBuilder
    from specsample_cupy.convert.llama_graph import build_graph

    shape = llama_shape(ckpt.config)
    shape = dataclasses.replace(shape, inv_freq=tuple(ckpt.inv_freq(shape)))
    external = None
    if _weight_bytes(shape, np.dtype(dtype).itemsize) > INLINE_LIMIT:
        external = ExternalData(out / "model.onnx.data")
    try:
        model = build_graph(ckpt, shape, GraphBuilder(dtype, dtype, external), attention)
    finally:
        if external is not None:
            external.close()
    onnx.save_model(model, str(out / "model.onnx"))
    return {**ckpt.config, "max_position_embeddings": shape.context, "torch_dtype": dtype}


def _write_gpt2(ckpt: TensorFolder, out: Path, dtype: str, attention: str) -> dict:
    """GPT-2's weights under models/export_onnx.py's names (Conv1D layout: the same as Hugging Face's)."""
    import onnx

    from specsample_cupy.runtime.layout import models_module
    export_onnx = models_module("export_onnx")
    build_model, expected_weight_shapes, full_config = (export_onnx.build_model, export_onnx.expected_weight_shapes,
                                                        export_onnx.full_config)

    cfg = ckpt.config
    if attention != "onnx":
        raise ConversionError(f"attention {attention!r} is not available for GPT-2 (its graph has one layout)")
    if cfg.get("activation_function", "gelu_new") != "gelu_new":
        raise ConversionError(f"config.json: activation_function {cfg['activation_function']!r} is not "
                              "supported for GPT-2 (gelu_new)")
    if cfg.get("n_inner") not in (None, 4 * cfg.get("n_embd", 0)):
        raise ConversionError(f"config.json: n_inner {cfg['n_inner']} is not supported (4 * n_embd)")
    full = full_config({k: v for k, v in cfg.items() if k in ("vocab_size", "n_positions", "n_embd", "n_layer",
                                                              "n_head", "bos_token_id", "eos_token_id",
                                                              "layer_norm_epsilon")})
    prefix = "transformer." if ckpt.has("transformer.wte.weight") else ""
    weights = {}
    for name, shape in expected_weight_shapes(full).items():
        source = prefix + (name + ".weight" if name in ("wte", "wpe") else name)
        weights[name] = ckpt.get_float(source, shape, np.float32)
    onnx.save_model(build_model(weights, full, weight_dtype=dtype), str(out / "model.onnx"))
    return {**full, "torch_dtype": dtype}


def convert(hf_dir, out_dir, *, dtype: str = "float16", overwrite: bool = False, attention: str = "onnx") -> Path:
    """Convert the checkpoint folder hf_dir into out_dir; returns out_dir.

    dtype: "float16" (CUDA: weights, arithmetic, cache and logits in float16) or "float32" (the CPU;
    GPT-2: float32 weights, where float16 keeps float16 weights and float32 arithmetic).
    Raises ConversionError, one line naming the problem, for a folder it cannot convert; out_dir is
    written only when the conversion succeeds (through a temporary folder beside it).
    attention: "onnx" (a masked cache: any batch, the device loop's default) or "gqa" (ONNX Runtime's
    GroupQueryAttention over a shared buffer, batch 1 for runs of several tokens; on CUDA float16
    only; see llama_graph.py)."""
    if attention not in ATTENTION:
        raise ConversionError(f"attention must be one of {', '.join(ATTENTION)}, got {attention!r}")
    if dtype not in DTYPES:
        raise ConversionError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    ckpt = open_checkpoint(hf_dir)
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConversionError(f"{out} exists and is not empty (pass overwrite=True / --overwrite to replace it)")
    if ckpt.side_file("tokenizer.json") is None:
        raise ConversionError(f"{ckpt.folder} has no tokenizer.json (save the tokenizer with a fast tokenizer)")
    architecture = (ckpt.config.get("architectures") or [None])[0]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        writer = _write_gpt2 if architecture == "GPT2LMHeadModel" else _write_llama
        config = writer(ckpt, tmp, dtype, attention)
        config["specsample_conversion"] = {"format": FORMAT_VERSION, "dtype": dtype, "attention": attention,
                                           "source": str(Path(hf_dir).resolve())}
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        for name in SIDE_FILES:
            if ckpt.side_file(name):
                shutil.copyfile(ckpt.side_file(name), tmp / name)
        tmp.chmod(0o755)   # mkdtemp's folders are private
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out
