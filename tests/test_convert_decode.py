"""A converted self-drafting pair decodes on the CPU host loop: greedy speculative decoding gives the
target-only tokens and accepts every draft (the draft is exactly the target's first layers)."""
import pytest

from helpers_convert import TINY
from models.hf_checkpoint import write_checkpoint
from specsample_cupy.convert import convert

PROMPTS = ["def f(x):", "import os\n", "class A:\n    def __init__(self"]


def converted_self_pair(root, dtype, config=TINY["qwen2-tied"], layers=4, draft_layers=2, attention="onnx"):
    """(target, draft) folders: a `layers`-layer target whose layers from draft_layers on have zero output
    projections, and the draft made of its first draft_layers layers (same seed: the same tensors)."""
    target = write_checkpoint(root / "hf_target", {**config, "num_hidden_layers": layers}, seed=5,
                              embed_scale=0.3, zero_layers_from=draft_layers)
    draft = write_checkpoint(root / "hf_draft", {**config, "num_hidden_layers": draft_layers}, seed=5,
                             embed_scale=0.3)
    return (convert(target, root / "target", dtype=dtype, attention=attention),
            convert(draft, root / "draft", dtype=dtype, attention=attention))


@pytest.fixture(scope="module")
def cpu_pair(tmp_path_factory):
    return converted_self_pair(tmp_path_factory.mktemp("pair"), "float32")


def test_greedy_speculative_equals_target_only_on_cpu(cpu_pair):
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    decoder = SpeculativeDecoder(*cpu_pair, device="cpu")
    alone = decoder.generate(PROMPTS, max_new_tokens=24, gamma=0, method="target", temperature=0, ignore_eos=True)
    spec = decoder.generate(PROMPTS, max_new_tokens=24, gamma=4, method="greedy", temperature=0, ignore_eos=True)
    assert spec.token_ids == alone.token_ids
    assert spec.stats["acceptance_rate"] == 1.0
    one = decoder.generate(PROMPTS[1], max_new_tokens=24, gamma=3, method="greedy", temperature=0, ignore_eos=True)
    assert one.token_ids[0] == alone.token_ids[1]


def test_mismatched_vocabularies_are_refused(tmp_path, cpu_pair):
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    other = write_checkpoint(tmp_path / "hf", {**TINY["qwen2-tied"], "vocab_size": 2200})
    with pytest.raises(ValueError, match="vocab sizes differ"):
        SpeculativeDecoder(cpu_pair[0], convert(other, tmp_path / "other", dtype="float32"), device="cpu")
