"""The random-weight tiny target/draft pair used by other tests."""
import json

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from tokenizers import Tokenizer  # noqa: E402

from models.build_tiny import EOS_ID, build_tiny_pair  # noqa: E402
from models.ort_decoder import OrtDecoder  # noqa: E402


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("vocab_size", [16, 500])
def test_tiny_pair_files_and_distributions(tmp_path, vocab_size):
    target_dir, draft_dir = build_tiny_pair(str(tmp_path), vocab_size=vocab_size)
    for d in (target_dir, draft_dir):
        for name in ("model.onnx", "config.json", "generation_config.json", "tokenizer.json"):
            assert (tmp_path / d / name).exists(), name
        cfg = json.loads(open(f"{d}/config.json").read())
        assert cfg["vocab_size"] == vocab_size and cfg["eos_token_id"] == EOS_ID
        tok = Tokenizer.from_file(f"{d}/tokenizer.json")
        assert tok.get_vocab_size() == vocab_size
        assert sorted(tok.get_vocab().values()) == list(range(vocab_size))

    target, draft = OrtDecoder(target_dir), OrtDecoder(draft_dir)
    ids = np.random.default_rng(0).integers(0, vocab_size, (2, 64))
    p, q = _softmax(target(ids)[0]), _softmax(draft(ids)[0])
    assert p.shape == q.shape == (2, 64, vocab_size)
    acceptance = np.minimum(p, q).sum(-1).mean()
    assert 0.3 < acceptance < 0.9, acceptance
    entropy = -(p * np.log(p)).sum(-1).mean()
    assert 0.25 * np.log(vocab_size) < entropy < 0.9 * np.log(vocab_size)
    assert p.max(-1).mean() < 0.8


def test_tiny_tokenizer_round_trip(tmp_path):
    target_dir, _ = build_tiny_pair(str(tmp_path), vocab_size=16)
    tok = Tokenizer.from_file(f"{target_dir}/tokenizer.json")
    enc = tok.encode("a test<|endoftext|>")
    assert enc.ids[-1] == EOS_ID and max(enc.ids) < 16
    assert tok.decode(enc.ids) == "a test"
    assert tok.encode("Z").ids == [1]  # out-of-vocabulary character -> <unk>


def test_tiny_pair_is_deterministic_and_seeded(tmp_path):
    a = build_tiny_pair(str(tmp_path / "a"), seed=7)
    b = build_tiny_pair(str(tmp_path / "b"), seed=7)
    c = build_tiny_pair(str(tmp_path / "c"), seed=8)
    read = lambda d: open(f"{d}/model.onnx", "rb").read()  # noqa: E731
    assert read(a[0]) == read(b[0]) and read(a[1]) == read(b[1])
    assert read(a[0]) != read(c[0]) and read(a[0]) != read(a[1])


def test_draft_can_be_shallower(tmp_path):
    target_dir, draft_dir = build_tiny_pair(str(tmp_path), n_layer=2, draft_n_layer=1,
                                            n_embd=48, n_head=4, n_positions=32)
    draft = OrtDecoder(draft_dir)
    assert draft.n_layer == 1 and OrtDecoder(target_dir).n_layer == 2
    logits, present = draft(np.zeros((1, 5), np.int64))
    assert np.isfinite(logits).all() and len(present) == 2
