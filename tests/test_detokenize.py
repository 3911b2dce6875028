"""Texts decoded piece by piece while requests are generated equal the text of all their ids."""
import numpy as np
import pytest

from specsample_cupy.decode.decoder import default_model_dir
from specsample_cupy.decode.detokenize import TextAssembler, splits_at_characters
from specsample_cupy.runtime.model_folder import ModelSpec


@pytest.fixture(scope="module")
def tokenizer():
    return ModelSpec.from_dir(default_model_dir("target")).tokenizer


def _assembled(tokenizer, ids, cuts, incremental=True):
    texts = TextAssembler(tokenizer, 1, incremental=incremental)
    for lo, hi in zip([0] + cuts, cuts + [len(ids)]):
        texts.add(0, ids[lo:hi])
    return texts


def test_multibyte_characters_split_at_every_position(tokenizer):
    """Byte-level tokens split 2-, 3- and 4-byte characters; every cut point gives the whole text."""
    assert splits_at_characters(tokenizer)
    ids = tokenizer.encode("héllo wörld ✓ 日本語 🐍 naïve\tend<|endoftext|>x").ids
    full = tokenizer.decode(ids, skip_special_tokens=True)
    pieces_used = 0
    for cut in range(1, len(ids)):
        texts = _assembled(tokenizer, ids, [cut])
        assert texts.text(0) == full, cut
        pieces_used += texts._done[0] != ""
    assert pieces_used > len(ids) // 2   # most cuts were decoded early, not all at the end


def test_random_ids_and_chunks(tokenizer):
    """Random ids (invalid UTF-8 and special tokens included) in random chunks, 500 sequences."""
    rng = np.random.default_rng(0)
    vocab = tokenizer.get_vocab_size()
    for _ in range(500):
        ids = rng.integers(0, vocab, rng.integers(1, 60)).tolist()
        cuts = sorted(set(rng.integers(1, max(len(ids), 2), rng.integers(0, 8)).tolist()) - {len(ids)})
        assert _assembled(tokenizer, ids, cuts).text(0) == tokenizer.decode(ids, skip_special_tokens=True)


def test_whole_decoding_without_the_byte_level_decoder(tokenizer):
    texts = _assembled(tokenizer, tokenizer.encode("plain text").ids, [1], incremental=False)
    assert texts._done[0] == "" and texts.text(0) == "plain text"
    assert texts.text(0) is texts.text(0)   # decoded once
