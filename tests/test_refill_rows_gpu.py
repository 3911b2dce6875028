"""decode_round.cu's refill_rows (continuous batching's refills on the device loop) against its NumPy
reference: the rows' sequences, counts, budgets, finished flags, slot masks, Philox stream bases and
temperatures written, every other row and field left as it was."""
import numpy as np
import pytest

from specsample_cupy.runtime import kernel_runtime


def refill_reference(state, streams, temps, packed, n, B, P, C, E):
    """What refill_rows writes, in NumPy (the module docstring of decode_round.cu gives the layouts)."""
    state, streams, temps = state.copy(), streams.copy(), temps.copy()
    rows = packed[:n]
    seq = packed[n:n + n * P].reshape(n, P)
    seq_len, limit, seed, base, temp_bits = packed[n + n * P:].reshape(5, n)
    at = np.cumsum([0, B * P, B, B, B, E, B * C, B * C])
    s_seq, s_len, s_limit, s_fin, _, mask_t, mask_d = (state[a:b] for a, b in zip(at, at[1:]))
    s_seq.reshape(B, P)[rows] = seq
    s_len[rows], s_limit[rows], s_fin[rows] = seq_len, limit, 0
    mask_t.reshape(B, C)[rows] = 0
    mask_d.reshape(B, C)[rows] = 0
    streams[rows, 0], streams[rows, 1] = seed, base
    temps[rows] = temp_bits.view(np.float64).astype(np.float32)
    return state, streams, temps


@pytest.mark.gpu
@pytest.mark.parametrize("B,n,P,C", [(8, 1, 64, 256), (16, 3, 320, 128), (5, 5, 7, 1000)])
def test_refill_rows_matches_reference(B, n, P, C):
    import cupy as cp
    rng = np.random.default_rng(B * 100 + n)
    E = 2
    state = rng.integers(-5, 1 << 40, B * P + 3 * B + E + 2 * B * C, dtype=np.int64)
    streams = rng.integers(0, 1 << 62, (B, 2), dtype=np.int64)
    temps = rng.random(B).astype(np.float32)
    rows = rng.choice(B, n, replace=False).astype(np.int64)
    packed = np.concatenate([rows, rng.integers(0, 50000, n * P), rng.integers(1, P, n), rng.integers(1, 4 * P, n),
                             rng.integers(-(1 << 62), 1 << 62, n), -rng.integers(0, 1000, n),
                             (rng.random(n) * 2).view(np.int64)]).astype(np.int64)
    kernel, = kernel_runtime.functions("decode_round.cu", ("refill_rows",))
    d_state, d_streams, d_temps, d_packed = (cp.asarray(a) for a in (state, streams, temps, packed))
    args = (d_packed, np.int32(n), d_state, np.int32(B), np.int32(P), np.int32(C), np.int32(E))
    kernel((n,), (256,), args + (d_streams, d_temps))
    want = refill_reference(state, streams, temps, packed, n, B, P, C, E)
    for got, expected in zip((d_state, d_streams, d_temps), want):
        np.testing.assert_array_equal(cp.asnumpy(got), expected)
    # Without per-row streams and temperatures (null pointers) only the state changes.
    d_state = cp.asarray(state)
    args = (d_packed, np.int32(n), d_state, np.int32(B), np.int32(P), np.int32(C), np.int32(E))
    kernel((n,), (256,), args + (np.uint64(0), np.uint64(0)))
    np.testing.assert_array_equal(cp.asnumpy(d_state), want[0])
