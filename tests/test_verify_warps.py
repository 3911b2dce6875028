"""Truncated sampling (top_k, top_p, min_p) in verify() and sample_tokens() on NumPy: the threshold
rule on hand-made rows and against a plain per-row implementation, the off values and top_k = 1,
argument checks, and exactness by chi-square (40,000 draws per configuration, fixed seeds, fail
below p = 1e-4; tokens outside the kept set must never appear)."""
import math

import numpy as np
import pytest

from helpers_verify import sample_rows
from specsample_cupy import sample_tokens, verify
from specsample_cupy.runtime import errors
from specsample_cupy.verification.truncation import (MinPWarps, Warps, apply_warps, build_warps, make_warps,
                                                     row_thresholds)

P_MIN = 1e-4
NEG = -np.inf


# ---------------------------------------------------------------- an independent statement of the rule

def kept_reference(z, T, top_k=0, top_p=1.0, min_p=0.0):
    """Boolean kept set of one row, entry by entry in plain Python (float64 mass, sequential sum)."""
    z = np.asarray(z, np.float32)
    V = z.size
    d = np.subtract(z.max(), z)                              # float32, as the rule says
    keep = np.ones(V, bool)
    if 0 < top_k < V:
        keep &= d <= sorted(d.tolist())[top_k - 1]
    if top_p < 1:
        order = sorted((j for j in range(V) if keep[j]), key=lambda j: d[j])
        weights = [math.exp(-float(d[j]) / T) for j in order]
        total = 0.0
        for w in weights:
            total += w
        goal, cum, cut = float(np.float32(top_p)) * total, 0.0, math.inf
        for j, w in zip(order, weights):
            cum += w
            if cum >= goal:
                cut = d[j]
                break
        keep &= d <= cut
    if min_p > 0:
        keep &= d <= np.float32(-T * math.log(min_p))
    return keep


def warped_probs(z, T, **warps):
    """softmax(z / T) over kept_reference's set, renormalised (float64)."""
    z = np.asarray(z, np.float64)
    w = np.exp((z - z.max()) / T) * kept_reference(z, T, **warps)
    return w / w.sum()


def kept_by_verify_rules(z, T=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """The kept set of one row as warps.apply_warps computes it."""
    z = np.asarray(z, np.float32)[None]
    w = make_warps(np, 1, z.shape[1], None, T, top_k, top_p, min_p)
    return np.isfinite(apply_warps(z, np.array([T]), w)[0]) if w is not None else np.ones(z.shape[1], bool)


# ---------------------------------------------------------------- chi-square with or without scipy

def chi2_sf(stat, dof):
    """P(chi2_dof >= stat): scipy's, or the Wilson-Hilferty approximation ((X / k)^(1/3) is
    nearly normal with mean 1 - 2 / (9k) and variance 2 / (9k)) where scipy is not installed."""
    try:
        from scipy.stats import chi2
    except ImportError:
        v = 2.0 / (9.0 * dof)
        zscore = ((stat / dof) ** (1.0 / 3.0) - (1.0 - v)) / math.sqrt(v)
        return 0.5 * math.erfc(zscore / math.sqrt(2.0))
    return float(chi2.sf(stat, dof))


def pooled_pvalue(counts, probs, min_expected=5.0):
    """Chi-square p-value of counts [V] against probs [V]; bins expecting fewer than min_expected
    draws are pooled. Asserts nothing was drawn where probs is 0."""
    counts, probs = np.asarray(counts, np.float64), np.asarray(probs, np.float64)
    assert counts[probs <= 0].sum() == 0, f"drew tokens outside the kept set: {np.flatnonzero(counts * (probs <= 0))}"
    obs, exp = counts[probs > 0], probs[probs > 0] / probs.sum() * counts.sum()
    small = exp < min_expected
    if small.any():
        obs, exp = np.append(obs[~small], obs[small].sum()), np.append(exp[~small], exp[small].sum())
        if exp[-1] < min_expected and exp.size > 1:         # still small: join the smallest other bin
            j = exp[:-1].argmin()
            obs[j] += obs[-1]
            exp[j] += exp[-1]
            obs, exp = obs[:-1], exp[:-1]
    if exp.size < 2:
        return 1.0
    return chi2_sf(float(((obs - exp) ** 2 / exp).sum()), exp.size - 1)


def test_wilson_hilferty_is_close_to_the_exact_tail():
    stats = pytest.importorskip("scipy.stats")
    for dof in (1, 3, 10, 39):
        for q in (1e-2, 1e-4):
            x = stats.chi2.isf(q, dof)
            v = 2.0 / (9.0 * dof)
            approx = 0.5 * math.erfc(((x / dof) ** (1 / 3) - (1 - v)) / math.sqrt(v) / math.sqrt(2))
            assert q / 3 < approx < q * 3


# ---------------------------------------------------------------- the rule on hand-made rows

def test_top_k_keeps_ties_at_the_kth_value():
    z = [1.0, 3.0, 3.0, 2.0, 3.0, 0.0]
    assert kept_by_verify_rules(z, top_k=1).tolist() == [0, 1, 1, 0, 1, 0]     # every tie of the max
    assert kept_by_verify_rules(z, top_k=2).tolist() == [0, 1, 1, 0, 1, 0]
    assert kept_by_verify_rules(z, top_k=4).tolist() == [0, 1, 1, 1, 1, 0]
    assert kept_by_verify_rules(z, top_k=5).tolist() == [1, 1, 1, 1, 1, 0]
    M, dmax = row_thresholds(np.float32([z]), np.ones(1), Warps(np.int32([4]), np.float32([1]), np.float32([np.inf])))
    assert M.tolist() == [3.0] and dmax.tolist() == [1.0]                      # the 4th smallest d


def test_top_p_crossing_inside_a_tie_group_keeps_the_group():
    # masses 1 : e^-1 : e^-1 : e^-5 (0.574, 0.211, 0.211, 0.004)
    z = [0.0, -1.0, -1.0, -5.0]
    assert kept_by_verify_rules(z, top_p=0.5).tolist() == [1, 0, 0, 0]
    assert kept_by_verify_rules(z, top_p=0.6).tolist() == [1, 1, 1, 0]        # crosses at the first -1
    assert kept_by_verify_rules(z, top_p=0.99).tolist() == [1, 1, 1, 0]
    assert kept_by_verify_rules(z, top_p=0.999).tolist() == [1, 1, 1, 1]
    # Reached exactly (cumulative sum 2 of 4) at the second of four tied entries: all kept.
    assert kept_by_verify_rules([2.0, 2.0, 2.0, 2.0], top_p=0.5).all()
    # Reached exactly at the end of the tie group of the max: the rest goes.
    assert kept_by_verify_rules([0.0, 0.0, -30.0, -30.0], top_p=0.5).tolist() == [1, 1, 0, 0]


def test_min_p_one_keeps_only_ties_of_the_max():
    z = [1.0, 3.0, 3.0, np.float32(3.0) - np.float32(2.0 ** -22), -np.inf]
    assert kept_by_verify_rules(z, min_p=1.0).tolist() == [0, 1, 1, 0, 0]
    assert kept_by_verify_rules(z, min_p=1.0, T=0.3).tolist() == [0, 1, 1, 0, 0]
    # p >= min_p * p_max: d <= ln 2 at T = 1
    assert kept_by_verify_rules([0.0, -0.69, -0.70, -3.0], min_p=0.5).tolist() == [1, 1, 0, 0]


def test_top_p_mass_is_measured_within_the_top_k_set():
    z = [0.0, -0.1, -0.2, -5.0, -5.0, -5.0]
    # Over the whole row p(0) = 0.37 < 0.5, so top-p alone keeps two entries; within the top-2 set
    # p(0) = 1 / (1 + e^-0.1) = 0.525 >= 0.5, so top-k then top-p keeps one.
    assert kept_by_verify_rules(z, top_p=0.5).tolist() == [1, 1, 0, 0, 0, 0]
    assert kept_by_verify_rules(z, top_k=2, top_p=0.5).tolist() == [1, 0, 0, 0, 0, 0]
    assert kept_by_verify_rules(z, top_k=3, top_p=0.5).tolist() == [1, 1, 0, 0, 0, 0]
    # min-p on top (relative to the max, so order-free): the smallest threshold wins.
    assert kept_by_verify_rules(z, top_k=3, top_p=0.9, min_p=0.86).tolist() == [1, 1, 0, 0, 0, 0]


def test_temperature_changes_top_p_and_min_p_sets():
    z = [0.0, -0.5, -1.3, -3.0]
    # top_p = 0.85: cumulative masses 0.52, 0.83, 0.97 at T = 1; 0.60, 0.90 at T = 0.7.
    assert kept_by_verify_rules(z, T=1.0, top_p=0.85).tolist() == [1, 1, 1, 0]
    assert kept_by_verify_rules(z, T=0.7, top_p=0.85).tolist() == [1, 1, 0, 0]
    # min_p = 0.2: span -T ln 0.2 = 1.61 at T = 1, 1.13 at T = 0.7.
    assert kept_by_verify_rules(z, T=1.0, min_p=0.2).tolist() == [1, 1, 1, 0]
    assert kept_by_verify_rules(z, T=0.7, min_p=0.2).tolist() == [1, 1, 0, 0]
    # top-k does not depend on T.
    assert kept_by_verify_rules(z, T=0.7, top_k=3).tolist() == kept_by_verify_rules(z, T=1.0, top_k=3).tolist()


def test_row_thresholds_match_the_plain_rule_on_random_rows():
    rng = np.random.default_rng(11)
    N, V = 400, 17
    # Integer-valued logits on a small range: many ties, some -inf entries.
    z = rng.integers(-4, 3, (N, V)).astype(np.float32) * rng.choice([1.0, 0.5], (N, 1)).astype(np.float32)
    z[rng.random((N, V)) < 0.1] = NEG
    z[:, 0] = 2.0                                                   # every row has mass
    k = rng.choice([0, 1, 2, 5, 9, V], N)
    p = rng.choice([1.0, 0.3, 0.5, 0.8, 0.95], N)
    m = rng.choice([0.0, 0.05, 0.3, 1.0], N)
    T = rng.choice([1.0, 0.7, 1.6], N)
    warps = make_warps(np, N, V, T.astype(np.float32), None, k, p, m)
    out = apply_warps(z, T.astype(np.float32).astype(np.float64), warps)
    for i in range(N):
        expect = kept_reference(z[i], float(np.float32(T[i])), int(k[i]), float(p[i]), float(m[i]))
        assert np.isfinite(out[i]).tolist() == (expect & np.isfinite(z[i])).tolist(), (z[i], k[i], p[i], m[i], T[i])
        assert (out[i][expect] == z[i][expect]).all()


def test_rows_without_a_finite_max_are_left_alone():
    z = np.float32([[0.0, np.nan, -1.0, -9.0], [np.inf, 0.0, -1.0, -9.0], [NEG] * 4])
    w = Warps(np.int32([1, 1, 1]), np.float32([0.5] * 3), np.float32([0.0] * 3))
    out = apply_warps(z, np.ones(3), w)
    np.testing.assert_array_equal(out, z)
    # Greedy (temperature 0) and bad-temperature rows are not warped either.
    z = np.float32([[0.0, -1.0, -9.0]] * 3)
    out = apply_warps(z, np.array([0.0, -1.0, 1.0]), Warps(np.int32([1] * 3), np.float32([1] * 3), np.float32([np.inf] * 3)))
    np.testing.assert_array_equal(out[:2], z[:2])
    assert out[2].tolist() == [0.0, NEG, NEG]


# ---------------------------------------------------------------- make_warps

def test_make_warps_values():
    assert make_warps(np, 3, 10, None, 1.0) is None
    assert make_warps(np, 3, 10, None, 1.0, top_k=0, top_p=1.0, min_p=0.0) is None
    assert make_warps(np, 3, 10, None, 1.0, top_k=np.array([10, 0, 99])) is None          # >= V: off
    w = make_warps(np, 3, 10, np.float32([1.0, 0.0, 0.5]), None, top_k=np.array([3, 10, 0]), min_p=0.5)
    assert w.top_k.dtype == np.int32 and w.top_k.tolist() == [3, 0, 0]
    assert w.top_p.dtype == np.float32 and w.top_p.tolist() == [1, 1, 1]
    assert w.span.dtype == np.float32
    assert w.span.tolist() == [np.float32(math.log(2)), np.inf, np.float32(0.5 * math.log(2))]  # T = 0: moot
    w = make_warps(np, 2, 10, None, 0.8, min_p=np.array([1.0, 0.0]), top_k=2.0)
    assert w.span.tolist() == [0.0, np.inf] and w.top_k.tolist() == [2, 2]


def test_min_p_alone_builds_min_p_warps():
    """The GPU verifier fuses min-p alone into its pass (warps.MinPWarps, only from make_warps);
    any request with top-k or top-p on takes the two-kernel path. Off values (top_k >= V, top_p = 1)
    count as off."""
    def fused(**kw):
        return isinstance(make_warps(np, 3, 10, None, 1.0, **kw), MinPWarps)
    assert fused(min_p=0.1)
    assert fused(min_p=np.array([0.1, 0.0, 0.2]), top_k=10, top_p=1.0)
    assert not fused(min_p=0.1, top_k=np.array([0, 0, 4]))
    assert not fused(min_p=0.1, top_p=np.array([1.0, 0.9, 1.0]))
    assert not fused(top_p=0.9)
    w = make_warps(np, 3, 10, None, 1.0, min_p=np.array([0.1, 0.0, 0.2]))
    picked = w.select(np.array([2, 2, 0]))   # one entry per row, the kind kept
    assert isinstance(picked, MinPWarps) and picked.span.tolist() == [w.span[2], w.span[2], w.span[0]]
    assert picked.top_k.tolist() == [0, 0, 0] and picked.top_p.tolist() == [1, 1, 1]
    assert not isinstance(Warps(w.top_k, w.top_p, w.span), MinPWarps)   # built by hand: the general path


BAD = [("top_p", 0.0), ("top_p", 1.5), ("top_p", float("nan")), ("top_p", -0.2),
       ("top_k", -1), ("top_k", 2.5), ("top_k", float("inf")), ("min_p", -0.1), ("min_p", 1.1),
       ("min_p", float("nan"))]


@pytest.mark.parametrize("arg,value", BAD)
@pytest.mark.parametrize("form", ["scalar", "array"])
def test_bad_values_raise_naming_the_argument(arg, value, form):
    rng = np.random.default_rng(0)
    B, G, V = 3, 2, 8
    tokens = rng.integers(0, V, (B, G))
    draft, target = rng.normal(size=(B, G, V)).astype(np.float32), rng.normal(size=(B, G + 1, V)).astype(np.float32)
    if form == "array":
        good = {"top_p": 0.9, "top_k": 3, "min_p": 0.1}[arg]
        value = np.array([good, value, good])
    with pytest.raises(ValueError, match=arg):
        verify(tokens, draft, target, **{arg: value})
    with pytest.raises(ValueError, match=arg):
        sample_tokens(target[:, 0], **{arg: value})


def test_array_of_the_wrong_shape_or_module_raises():
    B, G, V = 3, 1, 8
    tokens, draft, target = np.zeros((B, G), np.int32), np.zeros((B, G, V), np.float32), np.zeros((B, G + 1, V), np.float32)
    with pytest.raises(ValueError, match="top_k"):
        verify(tokens, draft, target, top_k=np.array([1, 2]))
    with pytest.raises(TypeError, match="top_p"):
        verify(tokens, draft, target, top_p=[0.5, 0.5, 0.5])


@pytest.mark.parametrize("method", ["sigmoid", "sigmoid-paper", "baseline"])
def test_other_methods_and_probs_refuse_warps(method):
    rng = np.random.default_rng(1)
    B, G, V = 2, 2, 8
    tokens = rng.integers(0, V, (B, G))
    draft, target = rng.normal(size=(B, G, V)).astype(np.float32), rng.normal(size=(B, G + 1, V)).astype(np.float32)
    with pytest.raises(ValueError, match=method):
        verify(tokens, draft, target, method=method, top_k=3)
    with pytest.raises(ValueError, match="probs"):
        verify(tokens, np.full((B, G, V), 1 / V, np.float32), np.full((B, G + 1, V), 1 / V, np.float32),
               probs=True, top_p=0.5)
    # Values that turn every warp off change nothing, for any method.
    plain = verify(tokens, draft, target, method=method, seed=3)
    off = verify(tokens, draft, target, method=method, seed=3, top_k=0, top_p=1.0, min_p=0.0)
    if method != "baseline":                     # baseline draws from a stateful generator
        np.testing.assert_array_equal(off.packed, plain.packed)


# ---------------------------------------------------------------- off values, top_k = 1, greedy

def _problem(rng, B, G, V, scale=2.0):
    target = (rng.normal(size=(B, G + 1, V)) * scale).astype(np.float32)
    draft = (0.7 * target[:, :G] + 0.3 * rng.normal(size=(B, G, V)) * scale).astype(np.float32)
    return rng.integers(0, V, (B, G)), draft, target


OFF = [dict(top_k=0), dict(top_k=24), dict(top_k=10 ** 9), dict(top_p=1.0), dict(min_p=0.0),
       dict(top_k=24, top_p=1.0, min_p=0.0),
       dict(top_k=np.array([0, 24, 30, 0, 99, 0]), top_p=np.ones(6, np.float32), min_p=np.zeros(6))]


@pytest.mark.parametrize("off", OFF, ids=range(len(OFF)))
def test_off_values_give_the_plain_tokens(off):
    rng = np.random.default_rng(5)
    B, G, V = 6, 4, 24
    tokens, draft, target = _problem(rng, B, G, V)
    lengths = np.array([4, 0, 2, 3, 1, 4])
    for seed, temperature in ((1, 1.0), (2, 0.7), (3, np.float32([1.0, 0.0, 0.5, 1.3, 0.0, 0.9]))):
        for d in (draft, None):
            plain = verify(tokens, d, target, temperature=temperature, seed=seed, offset=seed, draft_lengths=lengths)
            warped = verify(tokens, d, target, temperature=temperature, seed=seed, offset=seed,
                            draft_lengths=lengths, **off)
            np.testing.assert_array_equal(warped.packed, plain.packed)
    z = target[:, 0]
    np.testing.assert_array_equal(sample_tokens(z, seed=4, **off), sample_tokens(z, seed=4))


def test_top_k_1_is_greedy():
    rng = np.random.default_rng(6)
    B, G, V = 64, 5, 30
    _, draft, target = _problem(rng, B, G, V)
    # Proposals: the draft's argmax (what a top_k = 1 draft samples) for half the requests,
    # arbitrary ids for the rest (q(x) = 0 then, and x is accepted iff p(x) > 0: x is p's argmax).
    tokens = np.where(rng.random((B, 1)) < 0.5, draft.argmax(-1), rng.integers(0, V, (B, G)))
    tokens[:8] = target[:8, :G].argmax(-1)                            # some requests accept everything
    lengths = rng.integers(0, G + 1, B)
    greedy = verify(tokens, draft, target, method="greedy", draft_lengths=lengths)
    t_argmax = target.argmax(-1)
    match = (tokens == t_argmax[:, :G]) & (np.arange(G) < lengths[:, None])
    accepted = np.where(match.all(-1), lengths, (~match).argmax(-1))
    for seed in range(3):
        res = verify(tokens, draft, target, method="exact", temperature=1.0, top_k=1, seed=seed, offset=seed,
                     draft_lengths=lengths)
        assert res.accepted.tolist() == accepted.tolist()
        assert res.tokens[np.arange(B), accepted].tolist() == t_argmax[np.arange(B), accepted].tolist()
        np.testing.assert_array_equal(res.packed, greedy.packed)
        onehot = verify(tokens, None, target, top_k=1, seed=seed, offset=seed, draft_lengths=lengths)
        np.testing.assert_array_equal(onehot.packed, greedy.packed)
    assert sample_tokens(target[:, 0], top_k=1, seed=9).tolist() == t_argmax[:, 0].tolist()


def test_greedy_requests_ignore_the_warps():
    rng = np.random.default_rng(7)
    B, G, V = 5, 3, 20
    tokens, draft, target = _problem(rng, B, G, V)
    temps = np.float32([0.0, 1.0, 0.0, 0.8, 0.0])
    plain = verify(tokens, draft, target, temperature=temps, seed=1)
    warped = verify(tokens, draft, target, temperature=temps, seed=1, top_k=2, top_p=0.3, min_p=0.9)
    greedy = temps == 0
    np.testing.assert_array_equal(warped.tokens[greedy], plain.tokens[greedy])
    for method in ("greedy", "exact"):
        t = 1.0 if method == "greedy" else 0.0
        np.testing.assert_array_equal(
            verify(tokens, draft, target, method=method, temperature=t, top_k=3, top_p=0.5, min_p=0.2).packed,
            verify(tokens, draft, target, method=method, temperature=t).packed)


def test_errors_are_unchanged_by_the_warps():
    """Bad rows that both rules read give the same codes with and without the warps. Plain sampling
    validates only the rows its decisions read (reference_verify's rule), truncated sampling every
    active row (it warps them all): a bad row past the plain stop tells the two apart."""
    rng = np.random.default_rng(8)
    B, G, V = 5, 2, 16
    tokens, draft, target = _problem(rng, B, G, V)
    clean = verify(tokens, draft, target, seed=2)
    assert clean.accepted.tolist() == [1, 1, 2, 0, 0]   # where the plain walk stops without the edits
    target[0, 1, 3] = np.nan          # the row at the plain stop (1): read by both
    target[1, 0, 5] = np.inf          # position 0: read by both
    draft[2, 1] = NEG                 # a draft row before the plain stop (2): read whole by both
    tokens[3, 0] = V                  # request-level
    target[4, 2, 0] = np.inf          # past the plain stop (0): only the warps read it
    kw = dict(top_k=2, top_p=0.5, min_p=0.5)
    plain = verify(tokens, draft, target, seed=2)
    warped = verify(tokens, draft, target, seed=2, **kw)
    assert plain.error.tolist() == [errors.TARGET_VALUES, errors.TARGET_VALUES, errors.NO_MASS,
                                    errors.TOKEN_RANGE, 0]
    assert warped.error.tolist() == [errors.TARGET_VALUES, errors.TARGET_VALUES, errors.NO_MASS,
                                     errors.TOKEN_RANGE, errors.TARGET_VALUES]
    assert (warped.tokens == -1).all()
    assert (plain.tokens[:4] == -1).all()
    for f in ("accepted", "emitted", "tokens"):   # the unread row changes nothing
        np.testing.assert_array_equal(getattr(plain, f)[4], getattr(clean, f)[4], err_msg=f)


def test_half_and_bfloat16_inputs_warp_like_float32():
    rng = np.random.default_rng(9)
    B, G, V = 8, 3, 40
    tokens, draft, target = _problem(rng, B, G, V)
    kw = dict(temperature=0.8, seed=5, top_k=6, top_p=0.8, min_p=0.1)
    d16, t16 = draft.astype(np.float16), target.astype(np.float16)
    np.testing.assert_array_equal(verify(tokens, d16, t16, **kw).packed,
                                  verify(tokens, d16.astype(np.float32), t16.astype(np.float32), **kw).packed)
    bf = lambda a: (a.view(np.uint32) >> 16).astype(np.uint16)
    as_f32 = lambda a: (a.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(verify(tokens, bf(draft), bf(target), logits_dtype="bfloat16", **kw).packed,
                                  verify(tokens, as_f32(bf(draft)), as_f32(bf(target)), **kw).packed)


def test_onehot_proposal_outside_the_kept_set_is_rejected():
    V, G, B = 10, 2, 200
    row = np.linspace(0.0, -3.0, V).astype(np.float32)             # token 0 most likely
    target = np.broadcast_to(row, (B, G + 1, V)).copy()
    tokens = np.full((B, G), 5)
    res = verify(tokens, None, target, top_k=3, seed=1)
    assert (res.accepted == 0).all()
    assert set(res.tokens[:, 0].tolist()) <= {0, 1, 2}
    # Without the warp token 5 (p = 0.05) is sometimes accepted.
    assert (verify(tokens, None, target, seed=1).accepted > 0).any()


# ---------------------------------------------------------------- prebuilt warps (a decode loop's)

PREBUILT = [dict(top_k=5), dict(top_p=0.7), dict(min_p=0.1), dict(top_k=6, top_p=0.8, min_p=0.05),
            dict(top_k=np.array([0, 3, 30, 1, 0, 8]), top_p=np.float32([1, 0.5, 0.9, 1, 0.6, 0.95]),
                 min_p=np.array([0.0, 0.2, 0.0, 0.5, 0.1, 0.02]))]


@pytest.mark.parametrize("kw", PREBUILT, ids=range(len(PREBUILT)))
def test_prebuilt_warps_give_the_per_call_results(kw):
    """verify(warps=build_warps(...)) and sample_tokens(warps=...) equal the calls that build their warps
    from top_k / top_p / min_p, bit for bit: tokens, codes and log-probabilities."""
    rng = np.random.default_rng(11)
    B, G, V = 6, 4, 24
    tokens, draft, target = _problem(rng, B, G, V)
    lengths = np.array([4, 0, 2, 3, 1, 4])
    temperatures = (1.0, 0.7, 0.0, np.float32([1.0, 0.0, 0.5, 1.3, 0.0, 0.9]))
    for seed, temperature in enumerate(temperatures):
        warps = build_warps(np, B, V, temperature, **kw)
        for method in ("exact", "greedy"):
            for d in (draft, None):
                common = dict(method=method, temperature=temperature, seed=seed, offset=seed + 1,
                              draft_lengths=lengths, logprobs=True)
                per_call = verify(tokens, d, target, **common, **kw)
                prebuilt = verify(tokens, d, target, **common, **({} if warps is None else {"warps": warps}))
                np.testing.assert_array_equal(prebuilt.packed, per_call.packed)
                np.testing.assert_array_equal(prebuilt.logprobs, per_call.logprobs)
        z = target[:, 0]
        streams = np.stack([np.arange(B) + 5, np.full(B, seed)], axis=1)
        for draws in (dict(seed=seed, offset=3), dict(streams=streams)):
            np.testing.assert_array_equal(
                sample_tokens(z, temperature=temperature, warps=warps, **draws),
                sample_tokens(z, temperature=temperature, **draws, **kw))


def test_build_warps_checks_as_verify_does():
    B, V = 3, 8
    assert build_warps(np, B, V, 0.8) is None
    assert build_warps(np, B, V, 0.8, top_k=0, top_p=1.0, min_p=0.0) is None
    assert build_warps(np, B, V, 0.0, min_p=0.3) is None           # greedy: min-p is moot
    for arg, value in BAD:
        with pytest.raises(ValueError, match=arg):
            build_warps(np, B, V, 1.0, **{arg: value})
    with pytest.raises(ValueError, match="top_k"):
        build_warps(np, B, V, 1.0, top_k=np.array([1, 2]))
    with pytest.raises(ValueError, match="temperature"):
        build_warps(np, B, V, np.float32([1.0, 0.5]), top_k=2)


def test_prebuilt_warps_are_checked():
    rng = np.random.default_rng(12)
    B, G, V = 3, 2, 8
    tokens, draft, target = _problem(rng, B, G, V)
    warps = build_warps(np, B, V, 1.0, top_k=2)
    with pytest.raises(ValueError, match="not both"):
        verify(tokens, draft, target, warps=warps, top_p=0.5)
    with pytest.raises(ValueError, match="top_k"):
        verify(tokens, draft, target, warps=build_warps(np, B + 1, V, 1.0, top_k=2))
    with pytest.raises(ValueError, match="span"):
        verify(tokens, draft, target, warps=warps._replace(span=warps.span.astype(np.float64)))
    with pytest.raises(TypeError, match="Warps"):
        verify(tokens, draft, target, warps=tuple(warps))
    with pytest.raises(ValueError, match="sigmoid"):
        verify(tokens, draft, target, method="sigmoid", warps=warps)
    with pytest.raises(ValueError, match="not both"):
        sample_tokens(target[:, 0], warps=warps, top_k=2)


# ---------------------------------------------------------------- exactness by chi-square

CALLS, BATCH = 2, 20_000        # 40,000 draws per configuration, two calls with distinct offsets
CONFIGS = {"top_k": dict(top_k=5), "top_p": dict(top_p=0.8), "min_p": dict(min_p=0.1),
           "all": dict(top_k=12, top_p=0.9, min_p=0.05)}


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_first_token_follows_the_warped_target(config, temperature):
    warps = CONFIGS[config]
    rng = np.random.default_rng(sorted(CONFIGS).index(config) * 10 + int(temperature * 10))
    G, V = 2, 32
    target = (rng.normal(size=(G + 1, V)) * 2.0).astype(np.float32)
    draft = (0.6 * target[:G] + 0.8 * rng.normal(size=(G, V))).astype(np.float32)
    p = [warped_probs(target[i], temperature, **warps) for i in range(G + 1)]
    q = np.stack([warped_probs(draft[i], temperature, **warps) for i in range(G)])
    assert all((pi == 0).sum() > 0 for pi in p)                     # the warps do cut something
    counts = np.zeros(V)
    for call in range(CALLS):
        tokens = sample_rows(np.broadcast_to(q, (BATCH, G, V)), rng)   # drafts from the warped draft
        res = verify(tokens, np.broadcast_to(draft, (BATCH, G, V)), np.broadcast_to(target, (BATCH, G + 1, V)),
                     temperature=temperature, seed=17, offset=100 + call, **warps)
        assert (res.error == 0).all()
        counts += np.bincount(res.tokens[:, 0], minlength=V)
        for i in range(G + 1):                  # every emitted token lies in its row's kept set
            emitted = res.tokens[:, i][res.emitted > i]
            assert (p[i][emitted] > 0).all()
    assert 0.05 < (res.accepted > 0).mean() < 0.95                  # both branches are exercised
    pvalue = pooled_pvalue(counts, p[0])
    assert pvalue >= P_MIN, f"{config} T={temperature}: chi-square p-value {pvalue:.2e}"


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_sample_tokens_follows_the_warped_distribution(config, temperature):
    warps = CONFIGS[config]
    rng = np.random.default_rng(100 + sorted(CONFIGS).index(config))
    V = 24
    row = (rng.normal(size=V) * 2.0).astype(np.float32)
    probs = warped_probs(row, temperature, **warps)
    logits = np.broadcast_to(row, (BATCH, V))
    counts = sum(np.bincount(sample_tokens(logits, temperature=temperature, seed=3, offset=c, **warps), minlength=V)
                 for c in range(CALLS))
    pvalue = pooled_pvalue(counts, probs)
    assert pvalue >= P_MIN, f"{config} T={temperature}: chi-square p-value {pvalue:.2e}"


def test_sample_tokens_per_request_warps():
    V, B = 16, 20_000
    row = np.linspace(1.0, -2.0, V).astype(np.float32)
    top_k = np.where(np.arange(B) % 2 == 0, 3, 0)
    min_p = np.where(np.arange(B) % 2 == 0, 0.0, 0.3)
    out = sample_tokens(np.broadcast_to(row, (B, V)), seed=1, top_k=top_k, min_p=min_p)
    for part, kw in ((out[0::2], dict(top_k=3)), (out[1::2], dict(min_p=0.3))):
        assert pooled_pvalue(np.bincount(part, minlength=V), warped_probs(row, 1.0, **kw)) >= P_MIN
