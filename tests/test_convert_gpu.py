"""Converted checkpoints on CUDA: both models captured as CUDA graphs, the device loop, greedy speculative
decoding equal to target-only, and exact sampling's first token distributed as the target's."""
import numpy as np
import pytest

from helpers_convert import TINY
from helpers_decode_gpu import GPU_DECODE
from helpers_verify import merged_chisquare
from models.hf_checkpoint import write_checkpoint
from specsample_cupy.convert import convert
from specsample_cupy.convert.checkpoint import Checkpoint
from specsample_cupy.convert.families import llama_shape
from specsample_cupy.convert.numpy_forward import llama_logits
from test_convert_decode import PROMPTS, converted_self_pair

pytestmark = GPU_DECODE
P_VALUE_THRESHOLD = 1e-3


@pytest.fixture(scope="module")
def self_pair(tmp_path_factory):
    return converted_self_pair(tmp_path_factory.mktemp("gpu_pair"), "float16", TINY["llama3-untied"])


def test_greedy_on_the_device_loop_with_graphs(self_pair):
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    decoder = SpeculativeDecoder(*self_pair, device="cuda")
    alone = decoder.generate(PROMPTS, max_new_tokens=32, gamma=0, method="target", temperature=0, ignore_eos=True)
    spec = decoder.generate(PROMPTS, max_new_tokens=32, gamma=4, method="greedy", temperature=0, ignore_eos=True)
    assert spec.token_ids == alone.token_ids
    assert spec.stats["cuda_graphs"] == {"target": True, "draft": True}
    assert spec.stats["loop"] == "device" and alone.stats["loop"] == "device"
    assert spec.stats["acceptance_rate"] == 1.0


def test_exact_first_token_follows_the_target(tmp_path):
    """An independent draft (other weights): rejections and residual draws happen, and the first emitted
    token still follows the target's distribution (float64 reference of the same checkpoint)."""
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    config = {**TINY["qwen2-tied"], "num_hidden_layers": 2}
    hf_target = write_checkpoint(tmp_path / "hf_t", config, seed=7, embed_scale=0.25)
    hf_draft = write_checkpoint(tmp_path / "hf_d", config, seed=8, embed_scale=0.25, final_norm_scale=0.3)
    decoder = SpeculativeDecoder(convert(hf_target, tmp_path / "t"), convert(hf_draft, tmp_path / "d"), device="cuda")
    prompt = "def f(x):"
    ids = decoder.encode_prompts([prompt])[0]
    ckpt = Checkpoint(hf_target)
    logits = llama_logits(ckpt.get, llama_shape(ckpt.config), np.array([ids]))[0, -1]
    p = np.exp(logits - logits.max())
    p /= p.sum()
    counts = np.zeros(len(p))
    for seed in range(8):
        out = decoder.generate([prompt] * 500, max_new_tokens=5, gamma=3, method="exact", temperature=1.0,
                               seed=seed, ignore_eos=True)
        assert out.stats["loop"] == "device"
        np.add.at(counts, [t[0] for t in out.token_ids], 1)
        assert 0.01 < out.stats["acceptance_rate"] < 0.95   # both branches of verification taken
    assert merged_chisquare(counts, p) > P_VALUE_THRESHOLD
