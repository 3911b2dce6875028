"""The bad-request contract of verify(), for every method and input kind on both backends.

Every (method, input kind) x edge case is one test id. On the CPU (always) each case checks the
exact error code of the request that got the edge case, that a request with an error emits
nothing (tokens -1, accepted -1, emitted 0), and that every other request -- and the edited
request itself where its edit touched only rows, ids or positions the method must not read --
comes out exactly as in the same call without the edit. Only the rows a decision reads are
validated (cpu_numpy.reference_verify's rule, issue 38; "baseline" still validates every active
row), so request S's problem is laid out for it: position 0 is surely accepted, position 1 surely
rejected (the stop, whose rows are read whole), rows past it are never read; each bad-row edit comes
in a variant that is read (its code, no token) and one that is not, for some or all methods (code 0,
the twin's outcome). On the GPU (marked gpu) the same calls run
on CuPy and must equal the CPU field by field: tokens, emitted, accepted, error (argument errors:
the same exception). "exact"/"sigmoid"/"greedy" use random logits (the kernels and the reference
draw the same Philox numbers; "sigmoid" with offset 0 and scale 1); "baseline" draws from a stateful generator, so its problems have
one-hot rows that make every outcome independent of the draws.
"""
import dataclasses

import numpy as np
import pytest

from helpers_verify import random_problem, softmax
from specsample_cupy import verify
from specsample_cupy.runtime import errors
from specsample_cupy.verification.api import SAMPLING_ONLY

B, G, V = 4, 3, 24
S = 1                     # the request that gets the edge case
NEG = -np.inf
T_OK, D_OK, K_OK, M_OK, L_OK, TEMP = (errors.TARGET_VALUES, errors.DRAFT_VALUES, errors.TOKEN_RANGE,
                                      errors.NO_MASS, errors.LENGTH, errors.TEMPERATURE)

COMBOS = {                # id -> (method, probs)
    "exact-logits": ("exact", False),
    "exact-probs": ("exact", True),
    "sigmoid-logits": ("sigmoid", False),
    "sigmoid-paper-logits": ("sigmoid-paper", False),
    "baseline-logits": ("baseline", False),
    "baseline-probs": ("baseline", True),
    "greedy-logits": ("greedy", False),
    "greedy-probs": ("greedy", True),
}


@dataclasses.dataclass
class Problem:
    tokens: np.ndarray             # [B, G] int32
    draft: np.ndarray              # [B, G, V] float32
    target: np.ndarray             # [B, G+1, V] float32
    lengths: np.ndarray | None = None
    temperature: object = 1.0      # scalar or [B] float32

    def copy(self):
        return Problem(self.tokens.copy(), self.draft.copy(), self.target.copy(),
                       None if self.lengths is None else self.lengths.copy(),
                       self.temperature.copy() if isinstance(self.temperature, np.ndarray) else self.temperature)

    @property
    def G(self):
        return self.tokens.shape[1]


def base_problem(method, probs, gamma=G):
    rng = np.random.default_rng(20240 + gamma)
    if method == "baseline":
        # One-hot rows (0 at the hot id, -1000 elsewhere: softmax is exactly one-hot in float32 and
        # float64): acceptance is "draft id == target's hot id" and every sample is the hot id.
        t_hot = rng.integers(0, V, (B, gamma + 1))
        d_hot = t_hot[:, :gamma].copy()
        flip = rng.random((B, gamma)) < 0.4
        d_hot[flip] = (d_hot[flip] + rng.integers(1, V, int(flip.sum()))) % V
        target = np.full((B, gamma + 1, V), -1000.0)
        draft = np.full((B, gamma, V), -1000.0)
        np.put_along_axis(target, t_hot[..., None], 0.0, -1)
        np.put_along_axis(draft, d_hot[..., None], 0.0, -1)
        tokens = d_hot
    else:
        tokens, draft, target = random_problem(rng, B, gamma, V, scale=2.0, closeness=0.7)
        if gamma >= 2:
            _force_stop_at_1(tokens, draft, target)
    if probs:
        draft, target = softmax(draft.astype(np.float64)), softmax(target.astype(np.float64))
    return Problem(tokens.astype(np.int32), draft.astype(np.float32), target.astype(np.float32))


STOP = 1                  # where verification of request S stops (non-baseline methods, gamma >= 2)


def _force_stop_at_1(tokens, draft, target):
    """Request S (logits, in place): draft 0 is the target's argmax with draft row 0 = target row 0, a
    positive logit (accepted by every method: q = p, and in the paper's window), and draft 1 a token
    of target logit -inf (p = 0: rejected by every method; not the argmax)."""
    x0 = int(target[S, 0].argmax())
    target[S, 0, x0] = max(target[S, 0, x0], 1.0)
    draft[S, 0] = target[S, 0]
    x1 = (int(target[S, 1].argmax()) + 1) % V
    target[S, 1, x1] = NEG
    tokens[S, :2] = x0, x1


def _no_mass(probs):
    return 0.0 if probs else NEG


def _temps(p, value=None):
    t = np.array([1.0, 1.0, 0.7, 1.0], np.float32)
    if value is not None:
        t[S] = value
    p.temperature = t


def _lengths(p, value):
    p.lengths = np.full(B, p.G, np.int32)
    p.lengths[S] = value


@dataclasses.dataclass
class Case:
    """setup: applied to the call and to its twin without the edit; edit: the edge case itself;
    expect(method, probs): the error code of request S, or an exception type both backends raise;
    matches_twin: request S, when it gets no error, must equal the twin's (its edit is in data the
    method does not read); others_match: the other requests must equal the twin's."""
    setup: object
    edit: object
    expect: object
    matches_twin: bool = False
    gamma: int = G
    others_match: bool = True


def _put(attr, index, value):
    def edit(p, probs):
        getattr(p, attr)[index] = value(probs) if callable(value) else value
    return edit


def _all(code):
    return lambda method, probs: code


def _read_by(code, *methods):
    """code for the methods whose decisions read the edited data (and "baseline", which validates
    every active row), 0 for the others."""
    return lambda method, probs: code if method == "baseline" or method in methods else 0


def _not_greedy(code):
    return lambda method, probs: 0 if method == "greedy" else code


def _logits_temps(code_for):
    """Per-request temperatures: probs=True refuses them (an argument error on both backends)."""
    return lambda method, probs: ValueError if probs else code_for(method)


def _on_token(code):
    """+Inf in the draft token's column: "baseline" from probabilities also reports NO_MASS, its
    one-hot rows holding their only mass there (S's draft rows always; its target row 0 too, since in
    this problem S's draft 0 is the target's hot id)."""
    return lambda method, probs: code | (M_OK if method == "baseline" and probs else 0)


def _put_token(attr, pos, value, on_token=True):
    """Request S's entry at position pos in the column of its draft token there (or, on_token=False,
    the next column): the sigmoid methods read the former alone before the stop."""
    def edit(p, probs):
        x = int(p.tokens[S, pos])
        getattr(p, attr)[S, pos, x if on_token else (x + 1) % V] = value
    return edit


def _edit_many(*edits):
    def edit(p, probs):
        for e in edits:
            e(p, probs)
    return edit


nothing = lambda p, probs=None: None
CASES = {
    "clean": Case(nothing, nothing, _all(0), matches_twin=True),
    # Bad target data: at the stop (read whole by every method), at the token logit before it (read by
    # every method), elsewhere in a row before it (read by exact and greedy only), past it (read by none).
    "target_nan": Case(nothing, _put("target", (S, STOP, 5), np.nan), _all(T_OK)),
    "target_nan_off_token_before_stop": Case(nothing, _put_token("target", 0, np.nan, on_token=False),
                                             _read_by(T_OK, "exact", "greedy"), matches_twin=True),
    "target_nan_past_stop": Case(nothing, _put("target", (S, 2, 5), np.nan), _read_by(T_OK), matches_twin=True),
    "target_posinf": Case(nothing, _put_token("target", 0, np.inf), _on_token(T_OK)),
    "target_posinf_past_stop": Case(nothing, _put("target", (S, 2, 7), np.inf), _read_by(T_OK), matches_twin=True),
    # A negative probability is invalid; a logit far below the others is not (and changes nothing
    # for the one-hot rows of "baseline").
    "target_negative_value": Case(nothing, _put("target", (S, 0, 3), lambda probs: -0.25 if probs else -2000.0),
                                  lambda method, probs: T_OK if probs else 0),
    "target_nan_inactive_row": Case(lambda p: _lengths(p, 1), _put("target", (S, 3, 0), np.nan), _all(0),
                                    matches_twin=True),
    # Bad draft data (greedy reads no draft row): the row at the stop, the token logit before it, another
    # entry before it (exact only), past the stop (none).
    "draft_nan": Case(nothing, _put("draft", (S, STOP, 3), np.nan), _not_greedy(D_OK), matches_twin=True),
    "draft_nan_past_stop": Case(nothing, _put("draft", (S, 2, 3), np.nan), _read_by(D_OK), matches_twin=True),
    "draft_posinf": Case(nothing, _put_token("draft", 0, np.inf),
                         lambda method, probs: 0 if method == "greedy" else _on_token(D_OK)(method, probs),
                         matches_twin=True),
    "draft_posinf_off_token": Case(nothing, _put_token("draft", 0, np.inf, on_token=False), _read_by(D_OK, "exact"),
                                   matches_twin=True),
    "draft_nan_inactive_row": Case(lambda p: _lengths(p, 1), _put("draft", (S, 2, 4), np.nan), _all(0),
                                   matches_twin=True),
    # Position 0's target row without mass: exact and greedy read it whole; for the sigmoid methods its
    # token logit -inf (p = 0) rejects, and the row at that stop is read whole.
    "target_row_no_mass": Case(nothing, _put("target", (S, 0), _no_mass), _all(M_OK)),
    "target_row_no_mass_past_stop": Case(nothing, _put("target", (S, 2), _no_mass), _read_by(M_OK),
                                         matches_twin=True),
    "target_row_no_mass_inactive": Case(lambda p: _lengths(p, 1), _put("target", (S, 3), _no_mass), _all(0),
                                        matches_twin=True),
    "draft_row_no_mass": Case(nothing, _put("draft", (S, STOP), _no_mass), _not_greedy(M_OK), matches_twin=True),
    # Before the stop: exact reads the row whole; the sigmoid methods read its token logit, -inf (q = 0
    # accepts, as before), so the row is not read.
    "draft_row_no_mass_before_stop": Case(nothing, _put("draft", (S, 0), _no_mass), _read_by(M_OK, "exact"),
                                          matches_twin=True),
    "draft_row_no_mass_inactive": Case(lambda p: _lengths(p, 1), _put("draft", (S, 2), _no_mass), _all(0),
                                       matches_twin=True),
    "token_too_large": Case(nothing, _put("tokens", (S, 2), V), _all(K_OK)),
    "token_negative": Case(nothing, _put("tokens", (S, 0), -1), _all(K_OK)),
    "token_out_of_range_inactive": Case(lambda p: _lengths(p, 1), _put("tokens", (S, 2), V), _all(0),
                                        matches_twin=True),
    "length_above_gamma": Case(nothing, lambda p, probs: _lengths(p, G + 1), _all(L_OK)),
    "length_negative": Case(nothing, lambda p, probs: _lengths(p, -1), _all(L_OK)),
    "lengths_ragged": Case(lambda p: setattr(p, "lengths", np.array([0, 1, 2, 3], np.int32)), nothing, _all(0),
                           matches_twin=True),
    "temperature_zero": Case(lambda p: _temps(p), lambda p, probs: _temps(p, 0.0),
                             _logits_temps(lambda m: TEMP if m in SAMPLING_ONLY else 0)),
    "temperature_negative": Case(lambda p: _temps(p), lambda p, probs: _temps(p, -0.5), _logits_temps(lambda m: TEMP)),
    "temperature_nan": Case(lambda p: _temps(p), lambda p, probs: _temps(p, np.nan), _logits_temps(lambda m: TEMP)),
    "scalar_temperature_zero": Case(nothing, lambda p, probs: setattr(p, "temperature", 0.0),
                                    lambda method, probs: ValueError if probs or method in SAMPLING_ONLY
                                    else 0, others_match=False),
    # The id out of range at position 1 stops the walk there: target row 1 is read whole by every method.
    "several_codes": Case(nothing, _edit_many(_put("target", (S, 1, 1), np.nan), _put("tokens", (S, 1), V),
                                              lambda p, probs: _lengths(p, G + 2)),
                          _all(T_OK | K_OK | L_OK)),
    "gamma_zero": Case(nothing, nothing, _all(0), gamma=0),
    "gamma_zero_target_nan": Case(nothing, _put("target", (S, 0, 2), np.nan), _all(T_OK), gamma=0),
    "gamma_zero_no_mass": Case(nothing, _put("target", (S, 0), _no_mass), _all(M_OK), gamma=0),
    "gamma_zero_length": Case(nothing, lambda p, probs: _lengths(p, 1), _all(L_OK), gamma=0),
}

PARAMS = [pytest.param(combo, case, id=f"{combo}-{case}") for combo in COMBOS for case in CASES]


def build(combo, case_name):
    """(edited problem, twin without the edit, expected code or exception, case)."""
    method, probs = COMBOS[combo]
    case = CASES[case_name]
    twin = base_problem(method, probs, case.gamma)
    case.setup(twin)
    edited = twin.copy()
    case.edit(edited, probs)
    return edited, twin, case.expect(method, probs), case


def run(p, combo, xp=np, seed=5, offset=11):
    method, probs = COMBOS[combo]
    to = (lambda a: a) if xp is np else xp.asarray
    temperature = to(p.temperature) if isinstance(p.temperature, np.ndarray) else p.temperature
    # sigmoid(z) itself (offset 0, scale 1): weights far apart, so drafts get rejected and the
    # residual max(0, p - q) has no float cancellation to tell float32 from float64 apart.
    kw = dict(sigmoid_offset=0.0, sigmoid_scale=1.0) if method in ("sigmoid", "sigmoid-paper") else {}
    return verify(to(p.tokens), to(p.draft), to(p.target), method=method, probs=probs, temperature=temperature,
                  draft_lengths=None if p.lengths is None else to(p.lengths), seed=seed, offset=offset, **kw)


def host(res):
    get = lambda a: a.get() if hasattr(a, "get") else np.asarray(a)
    return {f: get(getattr(res, f)) for f in ("tokens", "accepted", "emitted", "error")}


def _check_structure(out, p, b):
    """A request without error: accepted in [0, L], its accepted drafts, one token in [0, V), then -1."""
    L = p.G if p.lengths is None else int(np.clip(p.lengths[b], 0, p.G))
    n = out["accepted"][b]
    assert 0 <= n <= L and out["emitted"][b] == n + 1
    assert out["tokens"][b, :n].tolist() == p.tokens[b, :n].tolist()
    assert 0 <= out["tokens"][b, n] < V
    assert (out["tokens"][b, n + 1:] == -1).all()


@pytest.mark.parametrize("combo, case_name", PARAMS)
def test_contract_cpu(combo, case_name):
    edited, twin, expect, case = build(combo, case_name)
    if isinstance(expect, type) and issubclass(expect, Exception):
        with pytest.raises(expect):
            run(edited, combo)
        return
    out, ref = host(run(edited, combo)), host(run(twin, combo))
    if COMBOS[combo][0] != "baseline" and case.gamma >= 2:
        assert ref["accepted"][S] == STOP, ref["accepted"]   # the layout the edits' positions assume
    assert out["error"][S] == expect, (out["error"], expect)
    others = [b for b in range(B) if b != S]
    assert (out["error"][others] == 0).all(), out["error"]
    assert (ref["error"] == 0).all(), ref["error"]
    for b in range(B):
        if out["error"][b]:
            assert out["tokens"][b].tolist() == [-1] * (edited.G + 1)
            assert out["accepted"][b] == -1 and out["emitted"][b] == 0
        else:
            _check_structure(out, edited, b)
    same = (others if case.others_match else []) + ([S] if expect == 0 and case.matches_twin else [])
    for f in out:
        np.testing.assert_array_equal(out[f][same], ref[f][same], err_msg=f)
    if case_name == "temperature_zero" and expect == 0:
        # Request S is greedy: what method="greedy" gives it.
        greedy = host(verify(edited.tokens, edited.draft, edited.target, method="greedy", seed=5, offset=11))
        assert out["tokens"][S].tolist() == greedy["tokens"][S].tolist()
    if case_name == "scalar_temperature_zero" and expect == 0:
        greedy = host(verify(edited.tokens, edited.draft, edited.target, method="greedy", seed=5, offset=11))
        for f in out:
            np.testing.assert_array_equal(out[f], greedy[f], err_msg=f)


@pytest.mark.gpu
@pytest.mark.parametrize("combo, case_name", PARAMS)
def test_contract_gpu_matches_cpu(combo, case_name):
    import cupy as cp
    edited, _, expect, _ = build(combo, case_name)
    if isinstance(expect, type) and issubclass(expect, Exception):
        with pytest.raises(expect):
            run(edited, combo, xp=cp)
        return
    cpu, gpu = host(run(edited, combo)), host(run(edited, combo, xp=cp))
    for f in ("tokens", "emitted", "accepted", "error"):
        np.testing.assert_array_equal(gpu[f], cpu[f], err_msg=f"{f}: GPU {gpu[f].tolist()} CPU {cpu[f].tolist()}")


# ---- greedy from probabilities (the argmax chain on both backends) ----------------------------
def _greedy_probs_problem():
    rng = np.random.default_rng(77)
    tokens, draft, target = random_problem(rng, 64, 4, 1000, scale=2.0)
    tokens[:, 0] = target[:, 0].argmax(-1)            # some chains get past position 0
    return tokens.astype(np.int32), softmax(draft.astype(np.float64)).astype(np.float32), \
        softmax(target.astype(np.float64)).astype(np.float32)


def _argmax_chain(tokens, target):
    argmax = target.argmax(-1)
    out = np.full((tokens.shape[0], tokens.shape[1] + 1), -1)
    for b in range(tokens.shape[0]):
        n = 0
        while n < tokens.shape[1] and tokens[b, n] == argmax[b, n]:
            n += 1
        out[b, :n] = tokens[b, :n]
        out[b, n] = argmax[b, n]
    return out


def test_greedy_from_probabilities_emits_the_argmax_cpu():
    tokens, draft, target = _greedy_probs_problem()
    res = verify(tokens, draft, target, method="greedy", probs=True)
    assert (res.error == 0).all()
    np.testing.assert_array_equal(res.tokens, _argmax_chain(tokens, target))


@pytest.mark.gpu
def test_greedy_from_probabilities_emits_the_argmax_gpu():
    import cupy as cp
    tokens, draft, target = _greedy_probs_problem()
    res = verify(cp.asarray(tokens), cp.asarray(draft), cp.asarray(target), method="greedy", probs=True)
    assert (res.error.get() == 0).all()
    np.testing.assert_array_equal(res.tokens.get(), _argmax_chain(tokens, target))


# ---- seed / offset arguments ---------------------------------------------------------------------
def test_seed_must_be_an_int_on_the_cpu():
    p = base_problem("exact", False)
    with pytest.raises(TypeError, match="seed"):
        verify(p.tokens, p.draft, p.target, seed=np.array([1]))
    with pytest.raises(TypeError, match="offset"):
        verify(p.tokens, p.draft, p.target, offset=2.0)


@pytest.mark.gpu
@pytest.mark.parametrize("arg", ["seed", "offset"])
def test_device_seed_and_offset_must_be_one_int64(arg):
    import cupy as cp
    p = base_problem("exact", False)
    args = (cp.asarray(p.tokens), cp.asarray(p.draft), cp.asarray(p.target))
    for bad in (cp.asarray([1], cp.int32), cp.asarray([1, 2], cp.int64), cp.asarray([1.0])):
        with pytest.raises(TypeError, match=f"{arg} as a device array must be a one-element int64"):
            verify(*args, **{arg: bad})
    good = verify(*args, **{arg: cp.asarray([7], cp.int64)}).tokens.get()
    np.testing.assert_array_equal(good, verify(*args, **{arg: 7}).tokens.get())
