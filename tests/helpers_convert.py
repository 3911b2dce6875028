"""Tiny Hugging Face checkpoints of each converted architecture, running a converted graph once, and
ONNX Runtime GenAI's genai_config.json for a converted folder."""
import json

import numpy as np

from models.hf_checkpoint import REAL_SHAPES

# Vocabulary 2100: the embedded tokenizer's 2048 tokens and filler. Real configs' keys, tiny shapes.
_TINY = {"vocab_size": 2100, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "bos_token_id": 0, "eos_token_id": 0,
         "max_position_embeddings": 512}

TINY = {
    "qwen2-tied": {**REAL_SHAPES["qwen2.5-0.5b"], **_TINY, "tie_word_embeddings": True},
    "llama3-untied": {**REAL_SHAPES["llama-3.1-8b"], **_TINY, "head_dim": 16,
                      "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
    "llama2-bias": {**REAL_SHAPES["llama-3.1-8b"], **_TINY, "num_key_value_heads": 4, "rope_scaling": None,
                    "rope_theta": 10000.0, "attention_bias": True},
    "mistral": {**_TINY, "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_act": "silu",
                "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "sliding_window": None, "num_key_value_heads": 1},
}


def run_graph(session, ids, mask, positions, past=None, kv=None, dtype=np.float32):
    """One ONNX Runtime run of a converted decoder: (logits, {present name: array})."""
    B = ids.shape[0]
    feeds = {"input_ids": np.asarray(ids, np.int64), "attention_mask": np.asarray(mask, np.int64),
             "position_ids": np.asarray(positions, np.int64)}
    for name in (i.name for i in session.get_inputs() if i.name.startswith("past_key_values.")):
        present = name.replace("past_key_values", "present")
        feeds[name] = past[present] if past else np.zeros((B, kv[0], 0, kv[1]), dtype)
    outs = session.run(None, feeds)
    names = [o.name for o in session.get_outputs()]
    return outs[0], dict(zip(names[1:], outs[1:]))


def write_genai_config(folder, filename: str, share_buffer: bool, **decoder_changes):
    """Replace folder's config.json by the genai_config.json ONNX Runtime GenAI's builder writes for it
    (decoder file `filename`; decoder_changes override the decoder's declared shapes)."""
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").unlink()
    decoder = {"filename": filename, "head_size": config["hidden_size"] // config["num_attention_heads"],
               "hidden_size": config["hidden_size"], "num_attention_heads": config["num_attention_heads"],
               "num_key_value_heads": config["num_key_value_heads"],
               "num_hidden_layers": config["num_hidden_layers"], **decoder_changes}
    genai = {"model": {"vocab_size": config["vocab_size"], "context_length": config["max_position_embeddings"],
                       "bos_token_id": 0, "eos_token_id": [0], "pad_token_id": 0, "decoder": decoder},
             "search": {"past_present_share_buffer": share_buffer}}
    (folder / "genai_config.json").write_text(json.dumps(genai))
