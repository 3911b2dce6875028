"""ONNX Runtime GenAI's model folders (the builder's output: genai_config.json, model.onnx, tokenizer.json):
their genai_config.json read as the Hugging Face config.json keys the sessions use, so such a folder
loads without a config.json.

    {"model": {"vocab_size", "context_length", "bos_token_id", "eos_token_id", "pad_token_id",
               "decoder": {"filename", "head_size", "hidden_size", "num_attention_heads",
                           "num_key_value_heads", "num_hidden_layers"}},
     "search": {"past_present_share_buffer", ...}}
"""
from __future__ import annotations

from pathlib import Path

GENAI_CONFIG = "genai_config.json"   # what marks a builder folder

# genai_config.json's model.decoder keys -> config.json's
_DECODER_KEYS = {"head_size": "head_dim", "hidden_size": "hidden_size", "num_attention_heads": "num_attention_heads",
                 "num_key_value_heads": "num_key_value_heads", "num_hidden_layers": "num_hidden_layers"}
_MODEL_KEYS = {"vocab_size": "vocab_size", "context_length": "max_position_embeddings",
               "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id", "pad_token_id": "pad_token_id"}


def config_from_genai(genai: dict, path: Path) -> tuple[dict, str | None]:
    """(config.json-style dict, the decoder's ONNX file name or None) from a parsed genai_config.json.
    ValueError naming the file when it has no model section."""
    model = genai.get("model")
    if not isinstance(model, dict):
        raise ValueError(f"{path}: no \"model\" object")
    decoder = model.get("decoder") if isinstance(model.get("decoder"), dict) else {}
    config = {ours: model[theirs] for theirs, ours in _MODEL_KEYS.items() if theirs in model}
    config.update({ours: decoder[theirs] for theirs, ours in _DECODER_KEYS.items() if theirs in decoder})
    search = genai.get("search") if isinstance(genai.get("search"), dict) else {}
    config["past_present_share_buffer"] = bool(search.get("past_present_share_buffer", False))
    filename = decoder.get("filename")
    return config, filename if isinstance(filename, str) else None


def check_graph_agrees(config: dict, source: Path, n_layer: int, n_kv_heads, head_dim, onnx_path: Path) -> None:
    """ValueError, one line naming both files, when the config's declared shapes differ from the graph's."""
    for key, graph_value in (("num_hidden_layers", n_layer), ("num_key_value_heads", n_kv_heads),
                             ("head_dim", head_dim)):
        declared = config.get(key)
        if declared is not None and isinstance(graph_value, int) and declared != graph_value:
            raise ValueError(f"{source} says {key} = {declared} but {onnx_path.name} has {graph_value}")
