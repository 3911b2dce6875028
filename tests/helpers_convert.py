"""Tiny Hugging Face checkpoints of each converted architecture, and running a converted graph once."""

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
