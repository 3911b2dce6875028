"""Hand-computed cases, edge cases and input validation of verify() on NumPy (the CPU reference)."""
import numpy as np
import pytest

from helpers_verify import random_problem
from specsample_cupy import errors, sample_tokens, verify
from specsample_cupy.philox import PURPOSE_ACCEPT, acceptance_uniform, random_bits

NEG = -np.inf


def one_hot_logits(V, token):
    row = np.full(V, NEG, np.float32)
    row[token] = 0.0
    return row


def test_identical_models_accept_everything_and_bonus_comes_from_target():
    V, G = 6, 3
    rng = np.random.default_rng(0)
    target = rng.normal(size=(1, G + 1, V)).astype(np.float32)
    target[0, G] = one_hot_logits(V, 4)              # the bonus row has a single token
    draft = target[:, :G].copy()
    tokens = np.array([[1, 2, 3]])
    res = verify(tokens, draft, target, seed=3)
    assert res.accepted.tolist() == [3]
    assert res.emitted.tolist() == [4]
    assert res.tokens.tolist() == [[1, 2, 3, 4]]


def test_zero_target_probability_rejects_and_residual_is_forced():
    V, G = 5, 3
    target = np.zeros((1, G + 1, V), np.float32)
    draft = np.zeros((1, G, V), np.float32)
    target[0, 1] = one_hot_logits(V, 3)              # position 1: target only allows token 3
    tokens = np.array([[0, 2, 1]])                   # position 0 accepted (p == q), 2 rejected
    for seed in range(20):
        res = verify(tokens, draft, target, seed=seed, offset=seed)
        assert res.accepted.tolist() == [1]
        assert res.tokens.tolist() == [[0, 3, -1, -1]]   # residual max(0, p - q) is one-hot at 3


def test_zero_draft_probability_is_always_accepted():
    V, G = 4, 1
    target = np.zeros((1, 2, V), np.float32)
    draft = np.zeros((1, 1, V), np.float32)
    draft[0, 0, 2] = NEG                             # q(2) = 0, p(2) = 1/4
    for seed in range(50):
        assert verify(np.array([[2]]), draft, target, seed=seed).accepted.tolist() == [1]


def test_empty_residual_falls_back_to_target_row():
    V = 6
    row = np.full(V, NEG, np.float32)
    row[5] = 0.0
    row[1] = 0.0
    target = np.stack([row, np.zeros(V, np.float32)])[None]
    draft = row[None, None].copy()
    target[0, 0, 1] = NEG                            # p(1) = 0: token 1 is rejected ...
    draft[0, 0] = target[0, 0]                       # ... and p == q, so max(0, p - q) == 0
    draft[0, 0, 1] = 0.0
    res = verify(np.array([[1]]), draft, target, seed=0)
    assert res.accepted.tolist() == [0]
    assert res.tokens.tolist() == [[5, -1]]          # sampled from p_0 = one-hot at 5


def test_u_exactly_zero_accepts_any_positive_target_probability():
    seed, offset = 0, 5296325                        # u(request 0, position 0) == 0 (found by search)
    u = acceptance_uniform(random_bits(seed, offset, 0, 0, PURPOSE_ACCEPT, 0))
    assert u == 0.0
    V = 3
    target = np.array([[[0.0, -30.0, 0.0], [0.0, 0.0, 0.0]]], np.float32)  # p(1) ~ 1e-13
    draft = np.array([[[NEG, 0.0, NEG]]], np.float32)                       # q(1) = 1
    res = verify(np.array([[1]]), draft, target, seed=seed, offset=offset)
    assert res.accepted.tolist() == [1]
    target[0, 0, 1] = NEG                                                   # p(1) = 0: rejected even so
    assert verify(np.array([[1]]), draft, target, seed=seed, offset=offset).accepted.tolist() == [0]


def test_greedy_follows_the_target_argmax_chain():
    rng = np.random.default_rng(1)
    B, G, V = 64, 5, 11
    tokens, draft, target = random_problem(rng, B, G, V)
    res = verify(tokens, draft, target, method="greedy")
    argmax = target.argmax(-1)
    for b in range(B):
        n = 0
        while n < G and tokens[b, n] == argmax[b, n]:
            n += 1
        assert res.accepted[b] == n
        assert res.tokens[b, :n].tolist() == tokens[b, :n].tolist()
        assert res.tokens[b, n] == argmax[b, n]
        assert (res.tokens[b, n + 1:] == -1).all()


def test_temperature_zero_is_greedy_and_tiny_temperature_converges_to_it():
    rng = np.random.default_rng(2)
    tokens, draft, target = random_problem(rng, 32, 4, 9)
    greedy = verify(tokens, draft, target, method="greedy")
    zero = verify(tokens, draft, target, temperature=0.0, seed=4)
    tiny = verify(tokens, draft, target, temperature=1e-6, seed=4)
    np.testing.assert_array_equal(zero.tokens, greedy.tokens)
    np.testing.assert_array_equal(tiny.tokens, greedy.tokens)


def test_per_request_temperature_with_greedy_rows():
    rng = np.random.default_rng(3)
    tokens, draft, target = random_problem(rng, 8, 3, 7)
    temps = np.array([0, 1, 0.5, 0, 2, 1, 0, 0.7], np.float32)
    res = verify(tokens, draft, target, temperature=temps, seed=9)
    greedy = verify(tokens, draft, target, method="greedy")
    for b in np.flatnonzero(temps == 0):
        assert res.tokens[b].tolist() == greedy.tokens[b].tolist()
    for b in np.flatnonzero(temps > 0):
        single = verify(tokens, draft, target, temperature=float(temps[b]), seed=9)
        assert res.tokens[b].tolist() == single.tokens[b].tolist()


def test_ragged_lengths_ignore_later_positions():
    rng = np.random.default_rng(4)
    tokens, draft, target = random_problem(rng, 3, 4, 10)
    lengths = np.array([0, 2, 4])
    res = verify(tokens, draft, target, draft_lengths=lengths, seed=1)
    assert (res.accepted <= lengths).all()
    garbage = draft.copy()
    garbage[1, 2:] = np.nan                          # past request 1's length: never read
    garbage[0] = np.nan
    again = verify(tokens, garbage, target, draft_lengths=lengths, seed=1)
    np.testing.assert_array_equal(again.tokens, res.tokens)
    assert res.tokens[0, 1:].tolist() == [-1] * 4


def test_probabilities_input_matches_logits_input():
    rng = np.random.default_rng(5)
    tokens, draft, target = random_problem(rng, 16, 3, 12)
    from helpers_verify import softmax
    a = verify(tokens, draft, target, seed=7)
    b = verify(tokens, softmax(draft.astype(np.float64)).astype(np.float32),
               softmax(target.astype(np.float64)).astype(np.float32), probs=True, seed=7)
    np.testing.assert_array_equal(a.tokens, b.tokens)


def test_same_seed_same_result_new_offset_new_result():
    rng = np.random.default_rng(6)
    tokens, draft, target = random_problem(rng, 64, 4, 50)
    a = verify(tokens, draft, target, seed=11, offset=3)
    b = verify(tokens, draft, target, seed=11, offset=3)
    c = verify(tokens, draft, target, seed=11, offset=4)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert (a.tokens != c.tokens).any()


def test_non_contiguous_inputs_are_handled():
    rng = np.random.default_rng(7)
    tokens, draft, target = random_problem(rng, 8, 3, 20)
    wide = np.zeros((8, 4, 40), np.float32)
    wide[:, :, ::2] = target
    res = verify(tokens, draft, wide[:, :, ::2], seed=2)
    np.testing.assert_array_equal(res.tokens, verify(tokens, draft, target, seed=2).tokens)


def test_bfloat16_storage_is_read_as_bfloat16():
    rng = np.random.default_rng(8)
    tokens, draft, target = random_problem(rng, 8, 2, 16)
    as_bf16 = lambda a: (a.view(np.uint32) >> 16).astype(np.uint16)
    res = verify(tokens, as_bf16(draft), as_bf16(target), logits_dtype="bfloat16", seed=5)
    trunc = lambda a: ((a.view(np.uint32) >> 16) << 16).view(np.float32)
    np.testing.assert_array_equal(res.tokens, verify(tokens, trunc(draft), trunc(target), seed=5).tokens)


def test_sample_tokens_greedy_and_distinct_stream():
    rng = np.random.default_rng(9)
    logits = rng.normal(size=(32, 20)).astype(np.float32)
    assert sample_tokens(logits, temperature=0).tolist() == logits.argmax(-1).tolist()
    s = sample_tokens(logits, seed=1, offset=2)
    assert s.shape == (32,) and s.dtype == np.int32 and ((0 <= s) & (s < 20)).all()


# ---- validation ------------------------------------------------------------------------------
def _ok(B=2, G=3, V=8):
    return random_problem(np.random.default_rng(0), B, G, V)


@pytest.mark.parametrize("mutate, exc, words", [
    (lambda t, d, p: (t[:, :2], d, p), ValueError, "draft_logits shape"),
    (lambda t, d, p: (t, d, p[:, :3]), ValueError, "target_logits shape"),
    (lambda t, d, p: (t, d[..., :7], p), ValueError, "vocabulary sizes differ"),
    (lambda t, d, p: (t, d, p.astype(np.float64)), TypeError, "target_logits must be float32"),
    (lambda t, d, p: (t, d.astype(np.float16), p), TypeError, "same dtype"),
    (lambda t, d, p: (t.astype(np.float32), d, p), TypeError, "draft_tokens must be an integer"),
    (lambda t, d, p: (t[0], d, p), ValueError, r"draft_tokens must be \[B, gamma\]"),
])
def test_bad_shapes_and_dtypes_name_the_argument(mutate, exc, words):
    with pytest.raises(exc, match=words):
        verify(*mutate(*_ok()))


def test_token_ids_out_of_range_name_the_request():
    t, d, p = _ok(B=3)
    t[2, 1] = 8
    res = verify(t, d, p)                            # value errors are returned, not raised
    assert res.error.tolist() == [0, 0, errors.TOKEN_RANGE]
    assert res.tokens[2].tolist() == [-1] * 4 and res.accepted[2] == -1 and res.emitted[2] == 0
    with pytest.raises(ValueError, match=r"draft_tokens has ids outside \[0, V\) in request\(s\) 2"):
        res.check()
    t[2, 1] = -1
    with pytest.raises(ValueError, match="draft_tokens"):
        verify(t, d, p).check()


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_and_inf_logits_name_the_request(bad):
    t, d, p = _ok(B=4)
    p = p.copy()
    p[1, 0, 3] = bad
    with pytest.raises(ValueError, match=r"target_logits .* request\(s\) 1"):
        verify(t, d, p).check()
    d = d.copy()
    d[3, 2, 0] = bad
    res = verify(t, d, _ok(B=4)[2])
    assert res.error.tolist() == [0, 0, 0, errors.DRAFT_VALUES]
    with pytest.raises(ValueError, match=r"draft_logits .* request\(s\) 3"):
        res.check()


def test_all_minus_inf_row_has_no_mass():
    t, d, p = _ok(B=2)
    p = p.copy()
    p[0, 1] = NEG
    res = verify(t, d, p)
    assert res.error.tolist() == [errors.NO_MASS, 0]
    with pytest.raises(ValueError, match=r"no probability mass .* in request\(s\) 0"):
        res.check()


def test_bad_arguments():
    t, d, p = _ok()
    with pytest.raises(ValueError, match="method"):
        verify(t, d, p, method="nope")
    with pytest.raises(ValueError, match="temperature"):
        verify(t, d, p, temperature=-1.0)
    with pytest.raises(ValueError, match=r"temperature .* request\(s\) 1"):
        verify(t, d, p, temperature=np.array([1.0, np.nan], np.float32)).check()
    with pytest.raises(ValueError, match=r"draft_lengths outside \[0, gamma\] in request\(s\) 0"):
        verify(t, d, p, draft_lengths=np.array([4, 1])).check()
    with pytest.raises(ValueError, match="draft_lengths must be a scalar or shape"):
        verify(t, d, p, draft_lengths=np.array([1, 1, 1]))
    with pytest.raises(ValueError, match="probs=True"):
        verify(t, d, p, probs=True, temperature=0.5)
    with pytest.raises(TypeError, match="seed"):
        verify(t, d, p, seed=1.5)
    with pytest.raises(TypeError, match="NumPy arrays or all CuPy"):
        verify(t.tolist(), d, p)
