"""Verification validates the rows its decisions read, and no others (cpu_numpy.reference_verify's
docstring states the rule; kernels_cu/verify.cu's first_rejection() applies it): a row no decision
reads may hold NaN or no mass without changing any token; a row that is read still yields its error
code and no token; and the emitted token follows each method's rule wherever the first rejection
falls. Every check runs on the CPU, and (marked gpu) on CuPy against the CPU, field by field."""
import numpy as np
import pytest

from helpers_verify import BACKENDS, backend_module, merged_chisquare, random_problem, softmax
from specsample_cupy import errors, verify

METHODS = ("exact", "greedy", "sigmoid", "sigmoid-paper")
SIGMOID_KW = dict(sigmoid_offset=0.0, sigmoid_scale=1.0)   # sigmoid(z) itself: drafts get rejected
B, G, V = 6, 4, 40


def _run(method, tokens, draft, target, xp=np, seed=3, offset=9, probs=False):
    to = (lambda a: a) if xp is np else xp.asarray
    kw = SIGMOID_KW if method.startswith("sigmoid") else {}
    res = verify(to(tokens), to(draft), to(target), method=method, seed=seed, offset=offset, probs=probs, **kw)
    get = lambda a: a.get() if hasattr(a, "get") else np.asarray(a)
    return {f: get(getattr(res, f)) for f in ("tokens", "accepted", "emitted", "error")}


def _problem(method, seed=0):
    rng = np.random.default_rng(seed)
    tokens, draft, target = random_problem(rng, B, G, V, scale=2.0, closeness=0.8)
    if method == "greedy":   # chains that get past position 0
        tokens[: B // 2, :2] = target[: B // 2, :2].argmax(-1)
    return tokens.astype(np.int32), draft, target


def _unread_spoiled(method, tokens, draft, target, n, kind):
    """Copies with every row no decision reads spoiled (NaN entries, or no mass); n: each request's
    stop from a clean run. Exact and greedy read whole rows up to n; the sigmoid methods the two
    token logits before n and the rows at n."""
    draft, target = draft.copy(), target.copy()
    bad = np.nan if kind == "nan" else -np.inf
    for b in range(B):
        k = n[b]
        target[b, k + 1:] = bad
        draft[b, k + 1:] = bad
        if method.startswith("sigmoid"):
            for i in range(k):
                keep_t, keep_d = target[b, i, tokens[b, i]], draft[b, i, tokens[b, i]]
                target[b, i] = bad
                draft[b, i] = bad
                target[b, i, tokens[b, i]], draft[b, i, tokens[b, i]] = keep_t, keep_d
        if method == "greedy":   # draft rows are never read
            draft[b] = bad
    return draft, target


def _assert_same(out, expected, msg, rows=slice(None)):
    for f in expected:
        np.testing.assert_array_equal(out[f][rows], expected[f][rows], err_msg=f"{msg} {f}")


def _check_unread(method, xp):
    tokens, draft, target = _problem(method)
    clean = _run(method, tokens, draft, target)
    assert (clean["error"] == 0).all()
    for kind in ("nan", "no_mass"):
        d, t = _unread_spoiled(method, tokens, draft, target, clean["accepted"], kind)
        _assert_same(_run(method, tokens, d, t, xp=xp), clean, f"{method} {kind}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", METHODS)
def test_rows_no_decision_reads_may_hold_anything(method, backend):
    _check_unread(method, backend_module(backend))


def _read_cases(method, tokens, draft, target, n):
    """(name, draft, target, request, expected code): one spoiled row (or token logit) that a decision
    of request b reads."""
    cases = []
    for b in range(B):
        k = n[b]
        off = (tokens[b, min(k, G - 1)] + 1) % V   # not the token: the row is read whole
        t = target.copy()
        t[b, k, off] = np.nan
        cases.append((f"target row n nan b{b}", draft, t, b, errors.TARGET_VALUES))
        t = target.copy()
        t[b, k] = -np.inf
        cases.append((f"target row n no mass b{b}", draft, t, b, errors.NO_MASS))
        if k < G and method != "greedy":
            d = draft.copy()
            d[b, k, off] = np.inf
            cases.append((f"draft row n inf b{b}", d, target, b, errors.DRAFT_VALUES))
        if k > 0:   # a position before n: exact reads its rows whole, sigmoid its token logits
            t = target.copy()
            t[b, 0, tokens[b, 0] if method.startswith("sigmoid") else off] = np.inf
            cases.append((f"position 0 inf b{b}", draft, t, b, errors.TARGET_VALUES))
    return cases


def _check_read(method, xp):
    tokens, draft, target = _problem(method, seed=1)
    clean = _run(method, tokens, draft, target)
    assert (clean["error"] == 0).all()
    for name, d, t, b, code in _read_cases(method, tokens, draft, target, clean["accepted"]):
        out = _run(method, tokens, d, t)
        assert out["error"][b] == code, (method, name, out["error"])
        assert out["tokens"][b].tolist() == [-1] * (G + 1) and out["emitted"][b] == 0, (method, name)
        _assert_same(out, clean, f"{method} {name}", rows=[k for k in range(B) if k != b])
        if xp is not np:
            _assert_same(_run(method, tokens, d, t, xp=xp), out, f"GPU {method} {name}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", METHODS)
def test_rows_a_decision_reads_still_yield_their_codes(method, backend):
    _check_read(method, backend_module(backend))


# ---- chi-square with the first rejection forced at each position ---------------------------------
N, GC, VC = 4000, 3, 12
P_MIN = 1e-4


def _forced(k, rng):
    """Identical rows for every request: positions before k accept surely (draft = target there and
    the token is drawn from it), position k rejects surely (the token has target logit -inf, a high
    draft logit), rows after k are NaN (never read). k = GC: every draft accepted (the bonus)."""
    target = rng.normal(size=(GC + 1, VC)) * 1.5
    draft = rng.normal(size=(GC, VC)) * 1.5
    draft[:k] = target[:k]
    tokens = np.array([int(np.argmax(softmax(target[i]))) for i in range(GC)])
    if k < GC:
        tokens[k] = 0
        target[k, 0] = -np.inf
        draft[k, 0] = 4.0
        target[k + 1:] = np.nan
        draft[k + 1:] = np.nan
    tok = np.broadcast_to(tokens, (N, GC)).astype(np.int32).copy()
    return tok, np.broadcast_to(draft, (N, GC, VC)).astype(np.float32).copy(), \
        np.broadcast_to(target, (N, GC + 1, VC)).astype(np.float32).copy()


def _predicted(method, k, draft, target):
    z = target[0, k].astype(np.float64)
    if k == GC:
        if method == "sigmoid-paper":
            w = np.maximum(z, 1e-5)
            return w / w.sum()
        return softmax(z)
    y = draft[0, k].astype(np.float64)
    if method == "exact":
        r = np.maximum(softmax(z) - softmax(y), 0.0)
        return r / r.sum()
    sig = lambda v: 1.0 / (1.0 + np.exp(-v))
    r = np.maximum(sig(z) - sig(y), 0.0)
    if method == "sigmoid":
        return r / r.sum() if r.sum() > 0 else sig(z) / sig(z).sum()
    clamp = lambda v: np.where(v < 0, 0.0, np.where(v > 1, 1.0, sig(v)))   # the paper's window
    r = np.maximum(clamp(z) - clamp(y), 0.0)
    w = np.maximum(r / (1e-6 + r.sum()), 1e-5)
    return w / w.sum()


def _check_chi2(method, k, xp):
    rng = np.random.default_rng(100 + k)
    tokens, draft, target = _forced(k, rng)
    out = _run(method, tokens, draft, target, xp=xp, seed=11 + k, offset=0)
    assert (out["error"] == 0).all() and (out["accepted"] == k).all(), (method, k)
    np.testing.assert_array_equal(out["tokens"][:, :k], tokens[:, :k])
    counts = np.bincount(out["tokens"][:, k], minlength=VC)
    assert merged_chisquare(counts, _predicted(method, k, draft, target)) >= P_MIN, (method, k, counts)


@pytest.mark.parametrize("k", range(GC + 1))
@pytest.mark.parametrize("method", ["exact", "sigmoid", "sigmoid-paper"])
def test_emitted_token_follows_the_rule_wherever_the_first_rejection_falls_cpu(method, k):
    _check_chi2(method, k, np)


@pytest.mark.gpu
@pytest.mark.parametrize("k", range(GC + 1))
@pytest.mark.parametrize("method", ["exact", "sigmoid", "sigmoid-paper"])
def test_emitted_token_follows_the_rule_wherever_the_first_rejection_falls_gpu(method, k):
    import cupy as cp
    _check_chi2(method, k, cp)
