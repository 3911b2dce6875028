"""The host loop drafts through one interface (decode/proposers.py): the draft model and prompt lookup
implement it, and a proposer of one's own plugs in without the loop knowing its kind."""
import warnings

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from specsample_cupy.decode import host_loop  # noqa: E402
from specsample_cupy.decode.decoder import SpeculativeDecoder  # noqa: E402
from specsample_cupy.decode.proposers import DraftModelProposer, NgramProposer, Proposal, host_proposer  # noqa: E402

PROMPTS = ["def fibonacci(n):", "import os\n"]


@pytest.fixture(scope="module")
def decoders():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # no CUDA device: decoding on the CPU
        return SpeculativeDecoder(device="cpu"), SpeculativeDecoder(draft="ngram", device="cpu")


def test_the_decoder_kind_picks_the_proposer(decoders):
    pair, ngram = decoders
    assert isinstance(host_proposer(pair, None, 2, 4), DraftModelProposer)
    assert isinstance(host_proposer(ngram, None, 2, 4), NgramProposer)


class Repeating:
    """A proposer of one's own: each request's last token, gamma times (one-hot drafts)."""

    def __init__(self, dec):
        self.upload, self.updates = dec.upload, 0

    def propose(self, req, gamma, sample):
        lengths = req.draft_lengths(gamma)
        g = int(lengths.max(initial=0))
        tokens = np.repeat(req.last_tokens()[:, None], g, axis=1).astype(np.int32)
        return Proposal(self.upload(np.ascontiguousarray(tokens)), lengths, None)

    def update(self, req):
        self.updates += 1


def test_a_new_proposer_plugs_into_the_host_loop(decoders, monkeypatch):
    pair, _ = decoders
    kwargs = dict(max_new_tokens=16, method="greedy", ignore_eos=True)
    expected = pair.generate(PROMPTS, gamma=0, **kwargs).token_ids
    made = []
    monkeypatch.setattr(host_loop, "host_proposer", lambda dec, *a: made.append(Repeating(dec)) or made[-1])
    out = pair.generate(PROMPTS, gamma=3, **kwargs)
    assert out.token_ids == expected   # greedy verification keeps the target's tokens, whatever is proposed
    assert made and made[-1].updates == out.stats["rounds"] and out.stats["proposed"] > 0
