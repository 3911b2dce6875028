"""Folders as ONNX Runtime GenAI's builder writes them load without a config.json: vocabulary, context,
special ids and the decoder's file from genai_config.json, checked against the graph."""
import json
import shutil

import pytest

from helpers_convert import TINY
from models.hf_checkpoint import write_checkpoint
from specsample_cupy.convert import convert


def _genai_folder(src, dst, **decoder_changes):
    """src (a converted folder) as a builder folder: genai_config.json instead of config.json, the
    decoder under the builder's file name."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").unlink()
    (dst / "model.onnx").rename(dst / "decoder.onnx")
    decoder = {"filename": "decoder.onnx", "head_size": config["hidden_size"] // config["num_attention_heads"],
               "hidden_size": config["hidden_size"], "num_attention_heads": config["num_attention_heads"],
               "num_key_value_heads": config["num_key_value_heads"],
               "num_hidden_layers": config["num_hidden_layers"], **decoder_changes}
    genai = {"model": {"vocab_size": config["vocab_size"], "context_length": config["max_position_embeddings"],
                       "bos_token_id": 0, "eos_token_id": [0], "pad_token_id": 0, "decoder": decoder},
             "search": {"past_present_share_buffer": False}}
    (dst / "genai_config.json").write_text(json.dumps(genai))
    return dst


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("genai")
    return convert(write_checkpoint(root / "hf", TINY["mistral"], seed=2, embed_scale=0.3), root / "model",
                   dtype="float32")


def test_builder_folder_loads_without_config_json(tmp_path, converted):
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    folder = _genai_folder(converted, tmp_path / "builder")
    plain = SpeculativeDecoder(converted, converted, device="cpu")
    builder = SpeculativeDecoder(folder, folder, device="cpu")
    args = dict(max_new_tokens=12, gamma=3, method="greedy", temperature=0, ignore_eos=True)
    assert builder.generate(["def f(x):", "a"], **args).token_ids == plain.generate(["def f(x):", "a"], **args).token_ids
    assert builder.target_spec.eos_token_ids == (0,)


def test_disagreeing_genai_config_is_refused(tmp_path, converted):
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    folder = _genai_folder(converted, tmp_path / "builder", num_hidden_layers=3)
    with pytest.raises(ValueError, match="num_hidden_layers = 3 but decoder.onnx has 2") as info:
        SpeculativeDecoder(folder, folder, device="cpu")
    assert "\n" not in str(info.value)
