"""The GroupQueryAttention layout (convert(attention="gqa")) on the device loop: both models captured,
one prompt per call, every column written at the row's count (decode_round.cu's dense columns).
Greedy speculative decoding equals target-only greedy with every draft accepted, with an independent
draft that is often rejected (rollbacks, re-fed draft columns, compactions), with automatic gamma, and
with prompt-lookup drafts; target-only follows the float64 reference; a batch decodes one prompt at a
time."""
import numpy as np
import pytest

from helpers_convert import TINY
from helpers_decode_gpu import GPU_DECODE
from models.hf_checkpoint import write_checkpoint
from specsample_cupy.convert import convert
from specsample_cupy.convert.checkpoint import Checkpoint
from specsample_cupy.convert.families import llama_shape
from specsample_cupy.convert.numpy_forward import llama_logits
from test_convert_decode import PROMPTS, converted_self_pair

pytestmark = GPU_DECODE
GREEDY = dict(method="greedy", temperature=0, ignore_eos=True)
TARGET = dict(gamma=0, method="target", temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def self_pair(tmp_path_factory):
    return converted_self_pair(tmp_path_factory.mktemp("gqa_pair"), "float16", TINY["llama3-untied"], attention="gqa")


@pytest.fixture(scope="module")
def other_pair(tmp_path_factory):
    """A target and an independent draft (other weights): many rejections. Untied heads: a tiny tied
    model with small embeddings repeats its last token (its logits are its input's embedding against
    the same table), and two such models agree on everything."""
    root = tmp_path_factory.mktemp("gqa_other")
    config = {**TINY["qwen2-tied"], "num_hidden_layers": 2, "tie_word_embeddings": False}
    hf_target = write_checkpoint(root / "hf_t", config, seed=7, embed_scale=0.25)
    hf_draft = write_checkpoint(root / "hf_d", config, seed=8, embed_scale=0.25)
    return hf_target, convert(hf_target, root / "t", attention="gqa"), convert(hf_draft, root / "d", attention="gqa")


def _each(decoder, **kw):
    """generate() once per prompt (the layout decodes one at a time): token lists and the outputs."""
    outs = [decoder.generate([p], **kw) for p in PROMPTS]
    return [o.token_ids[0] for o in outs], outs


def test_self_pair_accepts_everything_with_graphs(self_pair):
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    decoder = SpeculativeDecoder(*self_pair, device="cuda")
    alone, alone_out = _each(decoder, max_new_tokens=32, **TARGET)
    spec, spec_out = _each(decoder, max_new_tokens=32, gamma=4, **GREEDY)
    assert spec == alone
    for out in spec_out + alone_out:
        assert out.stats["loop"] == "device"
        assert out.stats["cuda_graphs"] == {"target": True, "draft": True}
    assert all(o.stats["acceptance_rate"] == 1.0 for o in spec_out)


def test_target_only_follows_the_reference(other_pair):
    """Each greedy token is the float64 reference's argmax, or within float16's error of it."""
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    hf_target, target, draft = other_pair
    decoder = SpeculativeDecoder(target, draft, device="cuda")
    ckpt = Checkpoint(hf_target)
    shape = llama_shape(ckpt.config)
    tokens, _ = _each(decoder, max_new_tokens=24, **TARGET)
    for prompt, new in zip(PROMPTS, tokens):
        ids = decoder.encode_prompts([prompt])[0]
        logits = llama_logits(ckpt.get, shape, np.array([ids + new]))[0, len(ids) - 1:-1]
        chosen = logits[np.arange(len(new)), new]
        assert np.all(logits.max(-1) - chosen <= 2e-3 * np.abs(logits).max())


def test_rejections_roll_back_by_count(other_pair):
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    _, target, draft = other_pair
    decoder = SpeculativeDecoder(target, draft, device="cuda")
    alone, _ = _each(decoder, max_new_tokens=96, **TARGET)
    for gamma in (3, "auto"):
        spec, outs = _each(decoder, max_new_tokens=96, gamma=gamma, **GREEDY)
        assert all(o.stats["loop"] == "device" for o in outs)
        if gamma == 3:   # independent weights: greedy drafts are mostly rejected
            assert [o.stats["acceptance_rate"] < 0.95 for o in outs] == [True] * len(outs)
            assert sum(o.stats["kv_compactions"] for o in outs) > 0   # columns of rejected drafts fill it
        assert spec == alone


def test_prompt_lookup_drafts(self_pair):
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    decoder = SpeculativeDecoder(self_pair[0], "ngram", device="cuda")
    alone, _ = _each(decoder, max_new_tokens=40, **TARGET)
    spec, outs = _each(decoder, max_new_tokens=40, gamma=4, **GREEDY)
    assert spec == alone and all(o.stats["loop"] == "device" for o in outs)


def test_a_batch_decodes_one_prompt_at_a_time(self_pair):
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    decoder = SpeculativeDecoder(*self_pair, device="cuda")
    received = {}
    out = decoder.generate(PROMPTS, max_new_tokens=8, gamma=4, on_tokens=lambda b, t: received.setdefault(b, []).extend(t),
                           **GREEDY)
    alone, _ = _each(decoder, max_new_tokens=8, **TARGET)
    assert out.token_ids == alone and [received[b] for b in range(len(PROMPTS))] == alone
    assert out.stats["one_prompt_at_a_time"] and out.stats["loop"] == "device"
