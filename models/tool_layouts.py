"""Folders laid out as the two standard ONNX tools lay them out, written here with the onnx helpers
(no torch, no download), for tests and benchmarks of loading them as they come:

- optimum_export(): a checkpoint's tensors as `optimum-cli export onnx` (torch.onnx) stores them:
  each Linear weight an initializer named onnx::MatMul_<n>, stored [in, out], read by a node named
  after its module (/model/layers.0/self_attn/q_proj/MatMul); every other tensor under its parameter
  name; config.json and the tokenizer beside it. Only the weights' graph is written (the nodes that
  read them), which is what the project reads from an export: on CUDA an export is converted once
  into the project's format (convert/cache.py).
- builder_folder(): a converted GroupQueryAttention folder (convert --attention gqa) as ONNX Runtime
  GenAI's builder writes it: total_sequence_length computed in the graph from Shape(attention_mask),
  genai_config.json in place of config.json.
- builder_export(): a checkpoint's tensors under the names the builder gives them
  (convert/builder_checkpoint.py lists them), its rotary tables and the nodes that say the rest (norm
  epsilon, attention attributes): the weights' graph, which is what the converter reads.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")
SIDE_FILES = ("config.json", "tokenizer.json", "generation_config.json")
TOTAL = "total_sequence_length"


def optimum_export(hf, dst, *, dtype=np.float32, external=False, drop=None, gemm=(), doubled_prefix=()):
    """hf's tensors (a Hugging Face checkpoint folder) as an optimum export in dst (see the module
    docstring), in `dtype`. external: weights in one model.onnx_data file (exports over 2 GB are).
    drop: a tensor left out. gemm: modules whose Linear is a Gemm with transB over [out, in] instead;
    doubled_prefix: modules whose node path is "/model/model/..." (both occur in real exports)."""
    import onnx
    from onnx import helper, numpy_helper

    from specsample_cupy.convert.checkpoint import Checkpoint

    hf, dst = Path(hf), Path(dst)
    ckpt = Checkpoint(hf)
    dst.mkdir(parents=True)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes, inits, inputs, outputs = [], [], [], []
    for n, name in enumerate(sorted(ckpt.names())):
        if name == drop:
            continue
        value = np.asarray(ckpt.get(name), dtype)
        module = name[:-len(".weight")] if name.endswith(".weight") else None
        if module is None or module.split(".")[-1] not in LINEAR:
            inits.append(numpy_helper.from_array(value, name))
            continue
        path = "/" + module.replace(".", "/")
        x, y = f"x{n}", f"y{n}"
        inputs.append(helper.make_tensor_value_info(x, elem, [1, value.shape[1]]))
        outputs.append(helper.make_tensor_value_info(y, elem, None))
        if module in gemm:
            inits.append(numpy_helper.from_array(value, f"onnx::Gemm_{n}"))
            nodes.append(helper.make_node("Gemm", [x, f"onnx::Gemm_{n}"], [y], name=path + "/Gemm", transB=1))
            continue
        if module in doubled_prefix:
            path = "/model" + path
        inits.append(numpy_helper.from_array(np.ascontiguousarray(value.T), f"onnx::MatMul_{n}"))
        nodes.append(helper.make_node("MatMul", [x, f"onnx::MatMul_{n}"], [y], name=path + "/MatMul"))
    graph = helper.make_graph(nodes, "main_graph", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save_model(model, str(dst / "model.onnx"), save_as_external_data=external,
                    all_tensors_to_one_file=True, location="model.onnx_data", size_threshold=0)
    for side in SIDE_FILES:
        if (hf / side).exists():
            shutil.copyfile(hf / side, dst / side)
    return dst


def genai_config(config: dict, filename: str, share_buffer: bool, **decoder_changes) -> dict:
    """The genai_config.json ONNX Runtime GenAI's builder writes for a model of Hugging Face `config`
    (decoder file `filename`; decoder_changes override the decoder's declared shapes)."""
    eos = config.get("eos_token_id", 0)
    decoder = {"filename": filename, "head_size": config.get("head_dim") or
               config["hidden_size"] // config["num_attention_heads"],
               "hidden_size": config["hidden_size"], "num_attention_heads": config["num_attention_heads"],
               "num_key_value_heads": config.get("num_key_value_heads", config["num_attention_heads"]),
               "num_hidden_layers": config["num_hidden_layers"], **decoder_changes}
    return {"model": {"type": config.get("model_type"), "vocab_size": config["vocab_size"],
                      "context_length": config["max_position_embeddings"],
                      "bos_token_id": config.get("bos_token_id", 0), "eos_token_id": eos if isinstance(eos, list)
                      else [eos], "pad_token_id": eos[0] if isinstance(eos, list) else eos, "decoder": decoder},
            "search": {"past_present_share_buffer": share_buffer}}


def write_genai_config(folder, filename: str, share_buffer: bool, **decoder_changes) -> None:
    """Replace folder's config.json by genai_config.json (genai_config())."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").unlink()
    (folder / "genai_config.json").write_text(json.dumps(genai_config(config, filename, share_buffer,
                                                                      **decoder_changes)))


def builder_folder(converted, dst):
    """A converted GroupQueryAttention folder as the builder writes it (module docstring). Weights in
    an external file stay there (the file is copied, the graph rewritten without loading it)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    converted, dst = Path(converted), Path(dst)
    shutil.copytree(converted, dst)
    model = onnx.load(str(dst / "model.onnx"), load_external_data=False)
    graph = model.graph
    graph.input.remove(next(i for i in graph.input if i.name == TOTAL))
    graph.initializer.append(numpy_helper.from_array(np.array(1, np.int64), "one_index"))
    graph.node.insert(0, helper.make_node("Shape", ["attention_mask"], ["mask_shape"]))
    graph.node.insert(1, helper.make_node("Gather", ["mask_shape", "one_index"], ["total_i64"], axis=0))
    graph.node.insert(2, helper.make_node("Cast", ["total_i64"], ["total_seq_len"], to=TensorProto.INT32))
    for node in graph.node:
        if node.op_type == "GroupQueryAttention":
            node.input[6] = "total_seq_len"
    onnx.save_model(model, str(dst / "model.onnx"))
    write_genai_config(dst, "model.onnx", True)
    return dst


def builder_export(hf, dst, *, dtype=np.float32, packed=True, tied=False, window=-1, drop=None, rotary=None,
                   quantized=False, external=False):
    """hf's tensors as the builder stores them (module docstring) in dst, in `dtype`, with
    genai_config.json and the tokenizer. packed: one q/k/v MatMul (the builder's default for
    GroupQueryAttention); tied: the embedding read from lm_head's weight; all-zero biases left out, as the
    builder does. window: GroupQueryAttention's local_window_size. drop: a tensor left out. rotary:
    (cos, sin) tables in place of the config's; quantized: one MatMulNBits node besides; external: the
    weights in model.onnx.data, as the builder stores them."""
    import onnx
    from onnx import helper, numpy_helper

    from specsample_cupy.convert.checkpoint import Checkpoint
    from specsample_cupy.convert.families import layer_names, llama_shape

    hf, dst = Path(hf), Path(dst)
    ckpt = Checkpoint(hf)
    s = llama_shape(ckpt.config)
    dst.mkdir(parents=True)
    tensors = {"lm_head.MatMul.weight": (ckpt.get("model.embed_tokens.weight") if s.tied
                                         else ckpt.get("lm_head.weight")).T,
               f"model.layers.{s.layers}.final_norm_layernorm.weight": ckpt.get("model.norm.weight")}
    if not tied:
        tensors["model.embed_tokens.weight"] = ckpt.get("model.embed_tokens.weight")
    for i in range(s.layers):
        names, p = layer_names(i), f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = ckpt.get(names["input_norm"])
        tensors[p + "post_attention_layernorm.weight"] = ckpt.get(names["post_norm"])
        qkv = [(n, ckpt.get(names[n]), ckpt.get(names[n + "_bias"]) if ckpt.has(names[n + "_bias"]) else None)
               for n in "qkv"]
        if packed:
            tensors[p + "attn.qkv_proj.MatMul.weight"] = np.concatenate([w for _, w, _ in qkv]).T
            if any(b is not None and b.any() for _, _, b in qkv):
                tensors[p + "attn.qkv_proj.Add.bias"] = np.concatenate([b for _, _, b in qkv])
        for n, w, b in ([] if packed else qkv) + [("o", ckpt.get(names["o"]),
                                                   ckpt.get(names["o_bias"]) if ckpt.has(names["o_bias"]) else None)]:
            tensors[p + f"attn.{n}_proj.MatMul.weight"] = w.T
            if b is not None and b.any():
                tensors[p + f"attn.{n}_proj.Add.bias"] = b
        for n in ("gate", "up", "down"):
            tensors[p + f"mlp.{n}_proj.MatMul.weight"] = ckpt.get(names[n]).T
    if rotary is None:   # as the builder computes them: float32 angles, then the model's dtype
        angles = np.arange(s.context, dtype=np.float32)[:, None] * np.asarray(s.inv_freq, np.float32)[None, :]
        rotary = np.cos(angles), np.sin(angles)
    tensors["cos_cache"], tensors["sin_cache"] = rotary
    inits = [numpy_helper.from_array(np.ascontiguousarray(np.asarray(v, np.float32).astype(dtype)), k)
             for k, v in tensors.items() if k != drop]
    nodes = [helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", f"model.layers.{i}.{n}.weight"],
                              [f"n{i}{n}"], name=f"/model/layers.{i}/{n}/SkipLayerNorm", domain="com.microsoft",
                              epsilon=s.rms_eps)
             for i in range(s.layers) for n in ("input_layernorm", "post_attention_layernorm")]
    nodes += [helper.make_node("GroupQueryAttention", ["q"], [f"a{i}"], name=f"/model/layers.{i}/attn/GQA",
                               domain="com.microsoft", num_heads=s.heads, kv_num_heads=s.kv_heads, do_rotary=1,
                               rotary_interleaved=0, local_window_size=window, softcap=0.0)
              for i in range(s.layers)]
    if tied:
        nodes.append(helper.make_node("Transpose", ["lm_head.MatMul.weight"], ["embed"], perm=[1, 0]))
    if quantized:
        nodes.append(helper.make_node("MatMulNBits", ["x"], ["y"], domain="com.microsoft", bits=4))
    graph = helper.make_graph(nodes, "main_graph", [], [], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    onnx.save_model(model, str(dst / "model.onnx"), save_as_external_data=external, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=0)
    config = json.loads((hf / "config.json").read_text())
    (dst / "genai_config.json").write_text(json.dumps(genai_config(config, "model.onnx", True)))
    shutil.copyfile(hf / "tokenizer.json", dst / "tokenizer.json")
    return dst
