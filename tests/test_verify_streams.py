"""Per-request random streams (verify(streams=...), sample_tokens(streams=...)) on the CPU: a request
draws what it draws alone, as row 0 of a one-request call with its own seed and offset, whatever its
row and the other rows."""
import numpy as np
import pytest

from helpers_verify import random_problem, softmax
from specsample_cupy import sample_tokens, verify


def _streams(rng, B):
    seeds = rng.integers(-2 ** 62, 2 ** 62, B)
    offsets = rng.integers(0, 2 ** 40, B)   # the offset word is the low 32 bits
    return np.stack([seeds, offsets], axis=1).astype(np.int64)


def _rows_alone(tokens, draft, target, streams, lengths=None, temps=None, **kw):
    """(accepted, tokens, error) of each request verified on its own with its stream's seed and offset."""
    out = []
    for b in range(len(tokens)):
        res = verify(tokens[b:b + 1], None if draft is None else draft[b:b + 1], target[b:b + 1],
                     seed=int(streams[b, 0]), offset=int(streams[b, 1]),
                     temperature=1.0 if temps is None else float(temps[b]),
                     draft_lengths=None if lengths is None else lengths[b:b + 1], **kw)
        out.append((int(res.accepted[0]), res.tokens[0].tolist(), int(res.error[0])))
    return out


def _rows(res):
    return [(int(a), t.tolist(), int(e)) for a, t, e in zip(res.accepted, res.tokens, res.error)]


@pytest.mark.parametrize("method", ["exact", "sigmoid", "sigmoid-paper", "greedy"])
def test_each_request_draws_what_it_draws_alone(method):
    rng = np.random.default_rng(1)
    B, G, V = 12, 4, 40
    tokens, draft, target = random_problem(rng, B, G, V, scale=1.5, closeness=0.8)
    lengths = rng.integers(0, G + 1, B).astype(np.int32)
    temps = rng.choice([0.5, 0.8, 1.3] + ([0.0] if method in ("exact", "greedy") else []), B).astype(np.float32)
    streams = _streams(rng, B)
    batch = verify(tokens, draft, target, method=method, temperature=temps, draft_lengths=lengths,
                   streams=streams, seed=999, offset=5)   # seed and offset are ignored
    assert _rows(batch) == _rows_alone(tokens, draft, target, streams, lengths, temps, method=method)
    # Another row order, the same requests: each one's result moves with it.
    order = rng.permutation(B)
    moved = verify(tokens[order], draft[order], target[order], method=method, temperature=temps[order],
                   draft_lengths=lengths[order], streams=streams[order])
    assert _rows(moved) == [_rows(batch)[b] for b in order]


def test_one_hot_drafts_probabilities_and_truncation_follow_the_stream():
    rng = np.random.default_rng(2)
    B, G, V = 10, 3, 32
    tokens, draft, target = random_problem(rng, B, G, V, scale=1.5, closeness=0.8)
    streams = _streams(rng, B)
    onehot = verify(tokens, None, target, streams=streams)
    assert _rows(onehot) == _rows_alone(tokens, None, target, streams)
    p, q = softmax(target.astype(np.float64)).astype(np.float32), softmax(draft.astype(np.float64)).astype(np.float32)
    probs = verify(tokens, q, p, probs=True, streams=streams)
    assert _rows(probs) == _rows_alone(tokens, q, p, streams, probs=True)
    truncated = verify(tokens, draft, target, temperature=0.8, top_k=5, top_p=0.9, streams=streams)
    alone = []
    for b in range(B):
        res = verify(tokens[b:b + 1], draft[b:b + 1], target[b:b + 1], temperature=0.8, top_k=5, top_p=0.9,
                     seed=int(streams[b, 0]), offset=int(streams[b, 1]))
        alone.append(_rows(res)[0])
    assert _rows(truncated) == alone


def test_the_same_stream_in_two_rows_draws_the_same_numbers():
    rng = np.random.default_rng(3)
    _, _, target = random_problem(rng, 1, 0, 50)
    logits = np.repeat(target[:, 0], 64, axis=0)
    same = sample_tokens(logits, streams=np.tile([[7, 3]], (64, 1)))
    assert (same == same[0]).all()
    rowwise = sample_tokens(logits, seed=7, offset=3)   # without streams rows draw apart
    assert len(set(rowwise.tolist())) > 1


def test_sample_tokens_with_streams_matches_rows_alone():
    rng = np.random.default_rng(4)
    B, V = 16, 300
    logits = (rng.normal(size=(B, V)) * 2).astype(np.float32)
    streams = _streams(rng, B)
    temps = rng.choice([0.0, 0.7, 1.0], B).astype(np.float32)
    got = sample_tokens(logits, temperature=temps, streams=streams)
    alone = [int(sample_tokens(logits[b:b + 1], temperature=float(temps[b]), seed=int(streams[b, 0]),
                               offset=int(streams[b, 1]))[0]) for b in range(B)]
    assert got.tolist() == alone
    assert sample_tokens(logits, temperature=0.7, seed=1, offset=2).tolist() == \
        sample_tokens(logits, temperature=0.7, seed=1, offset=2, streams=None).tolist()


def test_bad_streams_are_refused_naming_the_argument():
    rng = np.random.default_rng(5)
    tokens, draft, target = random_problem(rng, 3, 2, 16)
    with pytest.raises(ValueError, match=r"streams must be an integer array of shape \[B=3, 2\]"):
        verify(tokens, draft, target, streams=np.zeros((3,), np.int64))
    with pytest.raises(ValueError, match="streams must be an integer array"):
        verify(tokens, draft, target, streams=np.zeros((3, 2), np.float32))
    with pytest.raises(TypeError, match="same module"):
        verify(tokens, draft, target, streams=[[0, 0]] * 3)
    with pytest.raises(ValueError, match="baseline"):
        verify(tokens, draft, target, method="baseline", streams=np.zeros((3, 2), np.int64))
