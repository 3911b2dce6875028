"""Folders as ONNX Runtime GenAI's builder writes them load without a config.json: vocabulary, context,
special ids and the decoder's file from genai_config.json, checked against the graph."""
import shutil

import pytest

from helpers_convert import TINY
from models.tool_layouts import write_genai_config
from models.hf_checkpoint import write_checkpoint
from specsample_cupy.convert import convert


def _genai_folder(src, dst, **decoder_changes):
    """src (a converted folder) as a builder folder: genai_config.json instead of config.json, the
    decoder under the builder's file name."""
    shutil.copytree(src, dst)
    (dst / "model.onnx").rename(dst / "decoder.onnx")
    write_genai_config(dst, "decoder.onnx", False, **decoder_changes)
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
