"""Host-side bookkeeping of the decode loop on the CPU: the per-row append against the vectorised one,
take() (device rounds' host mirror) against append(), and the static cache's in-place compaction
(the GPU path's cache, run here over NumPy buffers)."""
import types

import numpy as np

from specsample_cupy.decode.request_state import Requests as _Requests
from specsample_cupy.runtime.sessions_static import StaticKVCache


def test_row_append_equals_vectorised_append():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        B, G = int(rng.integers(1, 6)), int(rng.integers(1, 7))
        budgets = rng.integers(0, 12, B)
        eos = tuple(int(t) for t in rng.choice([0, 1, 2], int(rng.integers(1, 3)), replace=False))
        prompts = [list(rng.integers(3, 9, int(rng.integers(1, 4)))) for _ in range(B)]
        rows, vectorised = _Requests(prompts, budgets, 0, eos, extra=8), _Requests(prompts, budgets, 0, eos, extra=8)
        vectorised.batch = 17   # above the per-row threshold: append() takes the NumPy path
        for _ in range(4):
            tokens, counts = rng.integers(0, 6, (B, G)), rng.integers(0, G + 1, B)
            assert (rows.append(tokens, counts) == vectorised.append(tokens, counts)).all()
            assert (rows.seq == vectorised.seq).all() and (rows.seq_len == vectorised.seq_len).all()
            assert (rows.finished == vectorised.finished).all()


def test_take_applies_appends_decisions():
    """Device rounds decide on the GPU what each row takes (round_done follows append()'s rules) and the
    host applies those decisions with take(): given append()'s decisions it ends in append()'s state."""
    rng = np.random.default_rng(2)
    for _ in range(500):
        B, G = int(rng.integers(1, 6)), int(rng.integers(1, 7))
        budgets = rng.integers(0, 12, B)
        prompts = [list(rng.integers(3, 9, int(rng.integers(1, 4)))) for _ in range(B)]
        ref, mirror = _Requests(prompts, budgets, 0, (0, 1), extra=8), _Requests(prompts, budgets, 0, (0, 1), extra=8)
        for _ in range(4):
            tokens, counts = rng.integers(0, 6, (B, G)), rng.integers(1, G + 1, B)
            taken = ref.append(tokens, counts)
            mirror.take(tokens, taken, ref.finished)
            assert (mirror.seq == ref.seq).all() and (mirror.seq_len == ref.seq_len).all()
            assert (mirror.finished == ref.finished).all() and mirror.finished is not ref.finished


def _static_cache(batch, heads, dim, capacity, n_tensors=2):
    session = types.SimpleNamespace(xp=np, cache_names=[None] * n_tensors, n_kv_heads=heads, head_dim=dim,
                                    kv_dtype=np.float32, stream=None)
    plan = types.SimpleNamespace(batch=batch, capacity=capacity,
                                 cache=np.zeros((n_tensors, batch * heads * capacity * dim), np.float32))
    return StaticKVCache(session, plan)


def test_static_cache_compacts_in_place_keeping_each_rows_tokens_in_order():
    rng = np.random.default_rng(1)
    B, H, D, C = 3, 2, 4, 16
    cache = _static_cache(B, H, D, C)
    blocks = cache._blocks(0, C)                           # [n, B, H, C, D] view of the one buffer
    written = []                                           # per row: the values of its real tokens, in order
    rows_real = [[] for _ in range(B)]
    for step in range(6):
        mask = rng.random((B, 2)) < 0.7
        for j in range(2):
            col = cache.length + j
            value = 100 * step + 10 * j + np.arange(B)
            blocks[:, :, :, col, :] = value[None, :, None, None]
            for b in range(B):
                if mask[b, j]:
                    rows_real[b].append(value[b])
        cache.advance(mask)
        written.append(mask)
    assert cache.length == 12 and cache.past()[0].shape == (B, H, C, D)
    cache.make_room(6)                                     # 12 + 6 > 16: compacts in place
    assert cache.compactions == 1 and cache.length == max(len(r) for r in rows_real)
    for b in range(B):
        real = np.flatnonzero(cache.mask[b])
        assert len(real) == len(rows_real[b])
        got = blocks[0, b, 0, real, 0]
        assert got.tolist() == rows_real[b], (b, got, rows_real[b])
        assert (blocks[1, b, 1, real, 3] == got).all()     # every tensor, head and channel moved alike
