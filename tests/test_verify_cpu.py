"""Hand-computed cases, edge cases and input validation of verify() on NumPy (the CPU reference)."""
import numpy as np
import pytest

from helpers_verify import random_problem, softmax
from specsample_cupy import sample_tokens, verify
from specsample_cupy.runtime import errors
from specsample_cupy.verification import cpu_numpy as reference
from specsample_cupy.runtime.philox import (PURPOSE_ACCEPT, PURPOSE_RESIDUAL, PURPOSE_SAMPLE, acceptance_uniform,
                                    random_bits)
from test_philox import race_exponential_before, random_bits_before

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
    (lambda t, d, p: (t, d, p.astype(np.int32)), TypeError, "target_logits must be float32"),
    (lambda t, d, p: (t, d.astype(np.float16), p), TypeError, "same dtype"),
    (lambda t, d, p: (t.astype(np.float32), d, p), TypeError, "draft_tokens must be an integer"),
    (lambda t, d, p: (t[0], d, p), ValueError, r"draft_tokens must be \[B, gamma\]"),
])
def test_bad_shapes_and_dtypes_name_the_argument(mutate, exc, words):
    with pytest.raises(exc, match=words):
        verify(*mutate(*_ok()))


def test_float64_logits_are_taken_as_float32():
    t, d, p = _ok()
    wide = verify(t, d.astype(np.float64), p.astype(np.float64), seed=3)
    assert wide.tokens.tolist() == verify(t, d, p, seed=3).tokens.tolist()


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
    clean = verify(t, d, _ok(B=4)[2])
    assert clean.accepted[3] == 0                    # request 3 stops at position 0: its rows there are read
    d = d.copy()
    d[3, 2, 0] = bad                                 # past the stop: never read, so no error and no change
    res = verify(t, d, _ok(B=4)[2])
    assert res.error.tolist() == [0, 0, 0, 0]
    np.testing.assert_array_equal(res.tokens, clean.tokens)
    d[3, 0, 0] = bad                                 # the draft row at the stop
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


# ---- The reference as first written (frozen): every row of both models normalised as whole arrays,
# Philox for every index. reference_verify now computes rows on demand (only up to the first
# rejection) and the race's counters once each; its results must stay bit for bit those below.
# The sigmoid modes' weights (reference.row_weights and the race weights of row n) are defined by
# the reference itself and used from it; what is frozen is everything around them.
# Which rows are validated follows issue 38's rule (reference_verify's docstring), stated here on
# whole arrays: every row's codes are computed, and only those of the rows a decision reads count
# (_reference_verify_before); rows=True is the rule of every active row (baseline, truncation).
def _request_errors_before(draft_tokens, draft, target, lengths, temps, *, probs, greedy_ok, greedy_all,
                           rows=True):
    B, G1, V = target.shape
    G = G1 - 1
    temps = temps.astype(np.float64)
    lengths = lengths.astype(np.int64)
    code = lambda mask, c: np.where(mask, int(c), 0).astype(np.int32)
    bad_t = ~((temps >= 0) & (temps < np.inf))
    if not greedy_ok:
        bad_t = bad_t | (temps == 0)
    err = code(bad_t, errors.TEMPERATURE)
    greedy = np.ones(B, dtype=bool) if greedy_all else (temps == 0) & ~bad_t
    temps = np.where(bad_t | greedy, 1.0, temps)
    err |= code((lengths < 0) | (lengths > G), errors.LENGTH)
    L = np.clip(lengths, 0, G)
    t_rows = np.arange(G1)[None, :] <= L[:, None]
    if rows:
        t_bits = _row_bits_before(target, probs, errors.TARGET_VALUES)
        err |= np.bitwise_or.reduce(np.where(t_rows, t_bits, 0), -1).astype(np.int32)
    if G:
        in_draft = np.arange(G)[None, :] < L[:, None]
        d_rows = in_draft & ~greedy[:, None]
        if rows:
            d_bits = _row_bits_before(draft, probs, errors.DRAFT_VALUES)
            err |= np.bitwise_or.reduce(np.where(d_rows, d_bits, 0), -1).astype(np.int32)
        err |= code((((draft_tokens < 0) | (draft_tokens >= V)) & in_draft).any(-1), errors.TOKEN_RANGE)
    return err, L, greedy, temps


def _row_bits_before(a, probs, value_code):
    """Code bits [..] int32 of every row of a [.., V]: value_code where it holds NaN or +Inf (probs:
    NaN, a negative value or +Inf), NO_MASS where no entry is > -Inf (probs: in (0, +Inf))."""
    if probs:
        invalid = ~((a >= 0) & (a < np.inf))
        no_mass = ~((a > 0) & (a < np.inf)).any(-1)
    else:
        invalid = ~(a < np.inf)
        no_mass = ~(a > -np.inf).any(-1)
    return (np.where(invalid.any(-1), int(value_code), 0) | np.where(no_mass, int(errors.NO_MASS), 0)).astype(np.int32)


def _row_weights_before(x, temps, *, mode, sigmoid_offset, sigmoid_scale):
    if mode != "logits":   # only the softmax was rewritten
        return reference.row_weights(x, temps, mode=mode, sigmoid_offset=sigmoid_offset, sigmoid_scale=sigmoid_scale)
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        x = x * (1.0 / temps)[:, None, None]
        top = x.max(-1, keepdims=True)
        w = np.exp(x - np.where(np.isfinite(top), top, 0.0))
        return w / w.sum(-1, keepdims=True)


def _sigmoid_race_weights_before(mode, residual, diff, z_n, temps, *, bonus):
    """The sigmoid modes' race weights of every row n as whole arrays: the softmax of z_n / T
    ('sigmoid') or max(1e-5, z_n / T) ('sigmoid-paper') for bonus rows; the residual ('sigmoid') or
    max(1e-5, max(0, diff) / (1e-6 + its sum)) ('sigmoid-paper') for the others."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if mode == "sigmoid":
            softmax = _row_weights_before(z_n[:, None, :], temps, mode="logits", sigmoid_offset=0.0,
                                          sigmoid_scale=1.0)[:, 0]
            return np.where(bonus[:, None], softmax, residual)
        diff = np.maximum(diff, 0.0)
        normalised = diff / (reference.PAPER_EPS + diff.sum(-1, keepdims=True))
        z = z_n.astype(np.float64) / temps[:, None]
        return np.maximum(np.where(bonus[:, None], z, normalised), reference.PAPER_FLOOR)


def _reference_verify_before(draft_tokens, draft, target, lengths, temps, *, mode, seed, offset,
                             race_purpose, sigmoid_offset, sigmoid_scale, greedy_all=False):
    B, G1, V = target.shape
    G = G1 - 1
    probs = mode == "probs"
    err, L, greedy, temps = _request_errors_before(draft_tokens, draft, target, lengths, temps,
                                                   probs=probs, greedy_all=greedy_all,
                                                   greedy_ok=mode not in reference.SIGMOID_MODES, rows=False)
    kw = dict(mode=mode, sigmoid_offset=sigmoid_offset, sigmoid_scale=sigmoid_scale)
    p = _row_weights_before(target, temps, **kw)
    q = _row_weights_before(draft, temps, **kw)
    b = np.arange(B)
    x = np.clip(draft_tokens, 0, V - 1).astype(np.int64)
    pos = np.arange(G)
    px = np.take_along_axis(p[:, :G], x[..., None], -1)[..., 0]
    qx = np.take_along_axis(q, x[..., None], -1)[..., 0]
    u = acceptance_uniform(random_bits_before(seed, offset, b[:, None], 0, PURPOSE_ACCEPT, pos[None, :]))
    with np.errstate(invalid="ignore"):
        accept = (px > 0) & (u * qx <= px)
    target_argmax = target.astype(np.float64).argmax(-1)
    accept = np.where(greedy[:, None], x == target_argmax[:, :G], accept)
    # The walk stops at the first position with an id outside [0, V), bad data where it reads (exact,
    # probs, greedy: the position's rows whole, the draft's unless greedy; sigmoid: the two token
    # logits, NaN or +Inf), or a rejection; the rows at the stop n are read whole: their codes count.
    t_bits, d_bits = _row_bits_before(target, probs, errors.TARGET_VALUES), _row_bits_before(draft, probs,
                                                                                          errors.DRAFT_VALUES)
    if mode in reference.SIGMOID_MODES:
        tx = np.take_along_axis(target[:, :G], x[..., None], -1)[..., 0]
        dx = np.take_along_axis(draft, x[..., None], -1)[..., 0]
        with np.errstate(invalid="ignore"):
            bad = ~(tx < np.inf) | ~(dx < np.inf)
    else:
        bad = (t_bits[:, :G] != 0) | ((d_bits != 0) & ~greedy[:, None])
    stop = (~accept | bad | (draft_tokens < 0) | (draft_tokens >= V)) & (pos[None, :] < L[:, None])
    n = np.where(stop.any(-1), stop.argmax(-1), L) if G else L
    err |= t_bits[b, n]
    if G:
        err |= np.where((n < L) & ~greedy, d_bits[b, np.minimum(n, G - 1)], 0).astype(np.int32)
    p_n = p[b, n]
    q_n = np.where((n < L)[:, None], q[b, np.minimum(n, max(G - 1, 0))] if G else 0.0, 0.0)
    with np.errstate(invalid="ignore"):
        residual = np.maximum(p_n - q_n, 0.0)
        residual = np.where((residual > 0).any(-1, keepdims=True), residual, p_n)
    if mode in reference.SIGMOID_MODES:
        residual = _sigmoid_race_weights_before(mode, residual, p_n - q_n, target[b, n], temps, bonus=n >= L)
    e = race_exponential_before(random_bits_before(seed, offset, b[:, None], n[:, None], race_purpose,
                                                   np.arange(V)[None, :]))
    with np.errstate(invalid="ignore", divide="ignore"):
        key = np.where(residual > 0, residual / e, -1.0)
    token = np.where(greedy, target_argmax[b, n], key.argmax(-1))
    err |= np.where((err == 0) & ~greedy & ~(key.max(-1) > 0), int(errors.NO_MASS), 0).astype(np.int32)
    return reference.verify_outputs(draft_tokens, n, token, err)   # output assembly: unchanged, shared


def _spoil_rows(rng, a, probs):
    """Edge-case rows in a [B, R, V] (in place): NaN, +Inf, -Inf entries, whole -Inf (or zero) rows,
    a single finite entry, ties for the maximum; probabilities also get negative entries."""
    B, R, V = a.shape
    for _ in range(rng.integers(0, 3) if R else 0):
        b, r, j = rng.integers(B), rng.integers(R), rng.integers(V)
        kind = rng.integers(7)
        if kind == 0:
            a[b, r, j] = np.nan
        elif kind == 1:
            a[b, r, j] = np.inf
        elif kind == 2:
            a[b, r, rng.random(V) < 0.5] = 0.0 if probs else -np.inf
        elif kind == 3:
            a[b, r] = 0.0 if probs else -np.inf
        elif kind == 4:
            a[b, r] = 0.0 if probs else -np.inf
            a[b, r, j] = 1.0
        elif kind == 5:
            a[b, r, rng.integers(V, size=3)] = a[b, r].max()
        else:
            a[b, r, j] = -1.0 if probs else -np.inf


def _random_case(rng):
    B, G = int(rng.integers(1, 6)), int(rng.integers(0, 6))
    V = int(rng.choice([1, 2, 3, 5, 8, 17, 64, 257, 1000, 4099]))
    mode = str(rng.choice(["logits", "logits", "greedy", "probs", *reference.SIGMOID_MODES]))
    probs = mode == "probs"
    tokens, draft, target = random_problem(rng, B, G, V, scale=float(rng.choice([0.5, 2.0, 8.0])),
                                           closeness=float(rng.random()))
    if rng.random() < 0.2:                           # identical models: every draft accepted
        draft = target[:, :G].copy()
    if probs:
        draft = softmax(draft.astype(np.float64)).astype(np.float32)
        target = softmax(target.astype(np.float64)).astype(np.float32)
    if rng.random() < 0.6:
        _spoil_rows(rng, target, probs)
        _spoil_rows(rng, draft, probs)
    if mode in reference.SIGMOID_MODES and rng.random() < 0.2:
        target, draft = target - 1e4, draft - 1e4   # steep sigmoids underflow to 0: no mass in the race
    dtype = np.float16 if rng.random() < 0.3 else np.float32
    draft, target = draft.astype(dtype), target.astype(dtype)
    if rng.random() < 0.2:
        tokens[rng.integers(B), :] = rng.choice([-1, V])
    lengths = np.full(B, G, np.int64)
    if rng.random() < 0.5:
        lengths = rng.integers(-1, G + 2, B)
    temps = np.ones(B)
    if rng.random() < 0.6:
        temps = rng.choice([1.0, 0.0, 0.5, 2.0, 1e-3, 1e-30, np.nan, -1.0, np.inf], B)
    sigmoid = dict(sigmoid_offset=0.0, sigmoid_scale=float(rng.choice([0.01, 1.0, 1000.0])))
    if rng.random() < 0.3:
        sigmoid = dict(sigmoid_offset=-10000.0, sigmoid_scale=20000.0)
    return (tokens, draft, target, lengths, temps), dict(
        mode="logits" if mode == "greedy" else mode, greedy_all=mode == "greedy",
        seed=int(rng.integers(0, 2 ** 63)) * int(rng.choice([1, 2])), offset=int(rng.integers(0, 2 ** 32)),
        race_purpose=int(rng.choice([PURPOSE_RESIDUAL, PURPOSE_SAMPLE])), **sigmoid)


def test_reference_is_bit_for_bit_the_full_array_reference_on_random_and_edge_cases():
    rng = np.random.default_rng(2024)
    seen, race_without_mass, unread_bad_rows = set(), False, False
    for case in range(400):
        args, kw = _random_case(rng)
        copies = [a.copy() for a in args]
        new = reference.reference_verify(*args, **kw)
        old = _reference_verify_before(*args, **kw)
        for a, c in zip(args, copies):
            np.testing.assert_array_equal(a, c)          # inputs untouched
        for name, n_out, o_out in zip(("accepted", "tokens", "emitted", "error"), new, old):
            assert n_out.dtype == o_out.dtype, (case, name)
            np.testing.assert_array_equal(n_out, o_out, err_msg=f"case {case}: {name} ({kw['mode']})")
        seen.update(("error", int(e)) for e in new[3])
        seen.update(("accepted", int(a)) for a in new[0])
        checked = _request_errors_before(*args[:5], probs=kw["mode"] == "probs", greedy_all=kw["greedy_all"],
                                         greedy_ok=kw["mode"] not in reference.SIGMOID_MODES)[0]
        race_without_mass |= bool(((checked == 0) & (new[3] == errors.NO_MASS)).any())
        unread_bad_rows |= bool(((checked != 0) & (new[3] == 0)).any())   # bad rows that no decision reads
    # The cases reach every error code and both ends of acceptance.
    for code in (errors.TEMPERATURE, errors.LENGTH, errors.TARGET_VALUES, errors.DRAFT_VALUES,
                 errors.NO_MASS, errors.TOKEN_RANGE):
        assert any(kind == "error" and e & code for kind, e in seen), code
    assert {("accepted", 0), ("accepted", 5), ("error", 0)} <= seen and race_without_mass and unread_bad_rows


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("B, V", [(1, 51865), (4, 32000)])
def test_reference_matches_the_full_array_reference_at_vocabulary_size(B, V, dtype):
    rng = np.random.default_rng(V + B)
    for closeness in (0.2, 0.9, 1.0):
        tokens, draft, target = random_problem(rng, B, 5, V, closeness=closeness)
        args = (tokens, draft.astype(dtype), target.astype(dtype), np.full(B, 5), np.array([1.0, 0.7, 0.0, 1.3])[:B])
        kw = dict(mode="logits", seed=7, offset=int(closeness * 10), race_purpose=PURPOSE_RESIDUAL,
                  sigmoid_offset=0.0, sigmoid_scale=1.0)
        for new, old in zip(reference.reference_verify(*args, **kw), _reference_verify_before(*args, **kw)):
            np.testing.assert_array_equal(new, old)


def test_rows_reused_across_calls_leave_no_trace():
    """Long softmax rows live in memory the thread's calls reuse (reference._RowPool): a call's
    results are its own (unchanged by later calls), each call equals the full-array reference, and
    the pool keeps no more than its limit."""
    rng = np.random.default_rng(3)
    kw = dict(mode="logits", race_purpose=PURPOSE_RESIDUAL, sigmoid_offset=0.0, sigmoid_scale=1.0)
    kept = []
    for call, closeness in enumerate((0.3, 0.95, 0.3, 1.0)):
        tokens, draft, target = random_problem(rng, 2, 5, 40000, closeness=closeness)
        args = (tokens, draft, target, np.array([5, 3]), np.array([1.0, 0.8]))
        new = reference.reference_verify(*args, seed=call, offset=0, **kw)
        for a, b in zip(new, _reference_verify_before(*args, seed=call, offset=0, **kw)):
            np.testing.assert_array_equal(a, b)
        kept.append((new, [np.copy(a) for a in new]))
    for new, copy in kept:
        for a, b in zip(new, copy):
            np.testing.assert_array_equal(a, b)
    pool = reference._RowPool.mine()
    assert 0 < pool.kept <= reference._RowPool.LIMIT
    assert pool.kept == sum(r.nbytes for rows in pool.free.values() for r in rows)


@pytest.mark.parametrize("mode", ["logits", "probs", *reference.SIGMOID_MODES])
def test_row_weights_of_single_rows_are_those_of_the_whole_array(mode):
    """What computing rows on demand relies on: row_weights() is a function of each row alone,
    bit for bit, and (logits, probs) unchanged from the full-array version above."""
    rng = np.random.default_rng(3)
    x = (rng.normal(size=(3, 4, 999)) * 4).astype(np.float32)
    if mode == "probs":
        x = softmax(x.astype(np.float64)).astype(np.float32)
    _spoil_rows(rng, x, mode == "probs")
    temps = np.array([1.0, 0.3, 7.0])
    kw = dict(mode=mode, sigmoid_offset=0.0, sigmoid_scale=2.0)
    with np.errstate(all="ignore"):
        whole = reference.row_weights(x, temps, **kw)
        np.testing.assert_array_equal(whole.view(np.uint64), _row_weights_before(x, temps, **kw).view(np.uint64))
        b, r = np.array([2, 0, 1, 2]), np.array([3, 1, 1, 0])
        rows = reference.row_weights(x[b, r][:, None], temps[b], **kw)[:, 0]
    np.testing.assert_array_equal(rows.view(np.uint64), whole[b, r].view(np.uint64))


@pytest.mark.parametrize("probs", [False, True])
def test_float16_checks_give_the_element_wise_codes_for_every_value(probs):
    """request_errors() reads float16 row extremes from the bit patterns: every float16 value,
    alone in a row and mixed with others, gives the codes of the element-wise rules."""
    every = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    rng = np.random.default_rng(12)
    alone = (every.reshape(-1, 1, 1), np.zeros((every.size, 0, 1), np.float16), np.zeros((every.size, 0), np.int64))
    mixed_target = rng.choice(every, (4096, 3, 9))
    mixed_target[::8] = rng.normal(size=(512, 3, 9)).astype(np.float16)    # rows with no special value
    mixed = (mixed_target, rng.choice(every, (4096, 2, 9)), np.zeros((4096, 2), np.int64))
    for target, draft, tokens in (alone, mixed):
        B = len(target)
        args = (tokens, draft, target, np.full(B, draft.shape[1]), np.ones(B))
        with np.errstate(invalid="ignore"):
            expected = _request_errors_before(*args, probs=probs, greedy_ok=True, greedy_all=False)[0]
        np.testing.assert_array_equal(reference.request_errors(*args, probs=probs)[0], expected)
