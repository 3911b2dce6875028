"""The CPU reference reads long float32 softmax rows at temperature 1 through float32 bounds
(reference._softmax_bounds, reference._softmax_race) and computes their float64 rows only where
those leave an acceptance or a race open: its results must stay bit for bit those of the float64
rows (the frozen full-array reference of test_verify_cpu)."""
import numpy as np
import pytest

from helpers_verify import random_problem
from specsample_cupy.verification import cpu_numpy as reference
from specsample_cupy.runtime.philox import (PURPOSE_ACCEPT, PURPOSE_RESIDUAL, acceptance_uniform, race_exponential,
                                    random_bits, random_row_bits)
from test_verify_cpu import _reference_verify_before, _spoil_rows

KW = dict(mode="logits", sigmoid_offset=0.0, sigmoid_scale=1.0)


def _rows(rng, V):
    """float32 rows [V] that stress the bounds: wide and narrow ranges, -inf entries, entries whose
    float32 exps are subnormal (just below -87 from the max) or 0, ties for the max, one finite entry."""
    rows = [(rng.normal(size=V) * scale).astype(np.float32) for scale in (0.5, 3.0, 30.0)]
    row = rows[1].copy()
    row[rng.random(V) < 0.3] = -np.inf
    rows.append(row)
    row = rows[1].copy()
    row[rng.integers(V, size=V // 2)] = row.max() - np.float32(rng.uniform(87, 104))
    row[rng.integers(V, size=9)] = row.max() - np.float32(1e4)
    rows.append(row)
    row = rows[0].copy()
    row[rng.integers(V, size=4)] = row.max()
    rows.append(row)
    row = np.full(V, -np.inf, np.float32)
    row[rng.integers(V)] = 3.0
    rows.append(row)
    return rows


def _weights(row):
    terms, sums = reference._softmax_terms(row[None, None], np.ones(1))
    return terms[0, 0], (terms / sums)[0, 0]


@pytest.mark.parametrize("V", [8193, 51865])
def test_float32_bounds_hold_and_terms_are_the_rows(V):
    rng = np.random.default_rng(V)
    scratch = np.empty(V, np.float32)
    for row in _rows(rng, V):
        terms, w = _weights(row)
        cols = np.concatenate([rng.integers(V, size=400), [row.argmax(), row.argmin(), 0, V - 1]])
        for c in cols:
            lo, hi = reference._softmax_bounds(row, row.max(), c, scratch)
            assert lo <= w[c] <= hi and hi <= lo * (1 + 3 * reference.SUM_SLACK) + 1e-300
            lo, t = reference._softmax_bounds(row, row.max(), c, None)
            assert lo == 0.0 and np.float64(t).view(np.uint64) == terms[c].view(np.uint64)   # the row's term


def test_float32_log_of_every_race_uniform():
    """_softmax_race's float32 exponentials: within a few ulps of float64 for all 2^23 uniforms,
    also near u = 1 where -log(u) is small."""
    k = np.arange(1 << 23, dtype=np.uint32)
    u = (k.astype(np.float32) + np.float32(0.5)) * np.float32(2.0 ** -23)
    np.testing.assert_array_equal(u.astype(np.float64), (k + 0.5) * 2.0 ** -23)   # race_exponential's
    assert np.abs(-np.log(u) / race_exponential(k << np.uint32(9)) - 1).max() < 2.0 ** -18


def _race64(row, bits):
    """reference._race's winner on the row's float64 weights with these Philox bits."""
    w = _weights(row)[1]
    key = np.where(w > 0, w / race_exponential(bits), -1.0)
    return int(key.argmax())


@pytest.mark.parametrize("V", [8193, 51865])
def test_float32_race_is_the_float64_race_or_left_open(V):
    rng = np.random.default_rng(V + 1)
    scratch = np.empty(V, np.float32)
    decided = 0
    for row in _rows(rng, V) * 3:
        bits = random_row_bits(int(rng.integers(1 << 62)), 0, 0, 0, PURPOSE_RESIDUAL, V)
        won = reference._softmax_race(row, row.max(), bits, scratch)
        assert won in (-1, _race64(row, bits))
        decided += won >= 0
        # Two entries of the largest weight with the smallest exponential tie for the largest key:
        # left open (float64 takes the first).
        a, b = row.argmax(), int(rng.integers(V))
        tied, tied_bits = row.copy(), bits.copy()
        tied[b] = tied[a]
        tied_bits[[a, b]] = bits[np.argmin(race_exponential(bits))]
        assert reference._softmax_race(tied, tied.max(), tied_bits, scratch) == -1
    assert decided >= 15


def _uniform(seed, offset, i):
    return float(acceptance_uniform(random_bits(seed, offset, 0, 0, PURPOSE_ACCEPT, i)))


def _count_calls(monkeypatch, owner, name):
    calls = []
    original = getattr(owner, name)

    def counted(*args, **kw):
        out = original(*args, **kw)
        calls.append(out)
        return out
    monkeypatch.setattr(owner, name, counted)
    return calls


def _check(args, **kw):
    kw = dict(KW, race_purpose=PURPOSE_RESIDUAL, **kw)
    for new, old in zip(reference.reference_verify(*args, **kw), _reference_verify_before(*args, **kw)):
        np.testing.assert_array_equal(new, old)


def test_acceptances_within_the_slack_are_decided_on_float64_rows(monkeypatch):
    """Drafts whose u q lies within 1e-5 of p: the bounds cannot decide, the float64 rows do."""
    exact_reads = _count_calls(monkeypatch, reference._RowsOnDemand, "at")
    rng = np.random.default_rng(11)
    V, outcomes = 20000, set()
    for seed in range(40):
        target = (rng.normal(size=(1, 2, V)) * 2).astype(np.float32)
        w = _weights(target[0, 0])[1]
        x = int(np.argsort(w)[-30])                   # p_x small enough that q_x = r p_x exists
        u, p_x = _uniform(seed, 3, 0), w[x]
        r = (1 + rng.choice([-1e-5, 1e-5])) / u      # u q_x = (1 +- 1e-5) p_x
        draft = target[:, :1].copy()
        draft[0, 0, x] += np.float32(np.log(r * (1 - p_x) / (1 - r * p_x)))
        args = (np.array([[x]]), draft, target, np.array([1]), np.array([1.0]))
        _check(args, seed=seed, offset=3)
        outcomes.add(int(reference.reference_verify(*args, seed=seed, offset=3, race_purpose=PURPOSE_RESIDUAL, **KW)[0][0]))
    assert exact_reads and outcomes == {0, 1}


def test_near_tied_races_are_decided_on_float64_rows(monkeypatch):
    """Bonus rows whose two largest keys lie within 1e-6: the float32 race leaves them open."""
    races = _count_calls(monkeypatch, reference, "_softmax_race")
    rng = np.random.default_rng(12)
    V = 20000
    for seed in range(20):
        target = (rng.normal(size=(1, 1, V)) * 2).astype(np.float32)
        e = race_exponential(random_row_bits(seed, 5, 0, 0, PURPOSE_RESIDUAL, V))
        a = int(np.argmax(np.exp(target[0, 0].astype(np.float64)) / e))
        b = int(rng.integers(V))
        target[0, 0, b] = target[0, 0, a] + np.float32(np.log(e[b] / e[a]))
        _check((np.zeros((1, 0), np.int64), np.zeros((1, 0, V), np.float32), target, np.array([0]), np.array([1.0])),
               seed=seed, offset=5)
    assert races.count(-1) >= 10


def _long_case(rng):
    B, G = int(rng.integers(1, 4)), int(rng.integers(0, 6))
    V = int(rng.choice([8193, 12000, 51865]))
    tokens, draft, target = random_problem(rng, B, G, V, scale=float(rng.choice([0.5, 2.0, 8.0])),
                                           closeness=float(rng.choice([0.3, 0.9, 0.99, 1.0])))
    if rng.random() < 0.3:                           # identical models: every draft accepted
        draft = target[:, :G].copy()
    if rng.random() < 0.3:
        _spoil_rows(rng, target, False)
        _spoil_rows(rng, draft, False)
    temps = np.where(rng.random(B) < 0.8, 1.0, rng.choice([0.0, 0.7], B))
    lengths = np.full(B, G) if rng.random() < 0.7 else rng.integers(0, G + 1, B)
    return (tokens, draft, target, lengths, temps), dict(seed=int(rng.integers(1 << 62)), offset=int(rng.integers(1 << 32)))


def test_long_float32_rows_are_bit_for_bit_the_full_array_reference(monkeypatch):
    bounded = _count_calls(monkeypatch, reference, "_softmax_bounds")
    rng = np.random.default_rng(2025)
    accepted = set()
    for _ in range(60):
        args, kw = _long_case(rng)
        _check(args, **kw)
        accepted.update(reference.reference_verify(*args, race_purpose=PURPOSE_RESIDUAL, **kw, **KW)[0].tolist())
    assert len(bounded) > 100 and {0, 5} <= accepted
