import numpy as np
import pytest

from specsample_cupy.runtime.philox import (PURPOSE_ACCEPT, PURPOSE_RESIDUAL, PURPOSE_SAMPLE, acceptance_uniform,
                                    philox4x32_10, race_exponential, random_bits, random_row_bits)


def test_known_answer_vectors():
    # Random123's published known-answer tests for philox4x32_10.
    cases = [
        ((0, 0, 0, 0, 0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 6, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344, 0xA4093822, 0x299F31D0),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ]
    for args, expected in cases:
        assert tuple(int(w) for w in philox4x32_10(*args)) == expected


def test_lanes_share_one_counter():
    words = philox4x32_10(1, 7 | (1 << 16), 3, 9, 42, 0)
    lanes = random_bits(42, 9, 3, 7, 1, np.arange(4, 8))
    assert [int(x) for x in lanes] == [int(w) for w in words]


def test_uniform_ranges():
    bits = random_bits(5, 0, np.arange(1000)[:, None], 0, PURPOSE_ACCEPT, np.arange(64)[None, :])
    u = acceptance_uniform(bits)
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01
    e = race_exponential(bits)
    assert np.isfinite(e).all() and e.min() > 0
    assert abs(e.mean() - 1.0) < 0.02
    assert acceptance_uniform(np.array([0xFFFFFFFF], np.uint32))[0] == np.float32(1 - 2 ** -24)


# ---- Philox and the word addressing as first written (frozen): one counter per index, lanes picked
# by where(). The faster functions must give the same words bit for bit.
def philox_before(c0, c1, c2, c3, k0, k1):
    u32, u64 = np.uint32, np.uint64
    c = [np.asarray(v, dtype=u32) for v in (c0, c1, c2, c3)]
    k0, k1 = int(k0) & 0xFFFFFFFF, int(k1) & 0xFFFFFFFF
    for r in range(10):
        if r:
            k0 = (k0 + 0x9E3779B9) & 0xFFFFFFFF
            k1 = (k1 + 0xBB67AE85) & 0xFFFFFFFF
        p0 = c[0].astype(u64) * u64(0xD2511F53)
        p1 = c[2].astype(u64) * u64(0xCD9E8D57)
        hi0, lo0 = (p0 >> u64(32)).astype(u32), (p0 & u64(0xFFFFFFFF)).astype(u32)
        hi1, lo1 = (p1 >> u64(32)).astype(u32), (p1 & u64(0xFFFFFFFF)).astype(u32)
        c = [hi1 ^ c[1] ^ u32(k0), lo1, hi0 ^ c[3] ^ u32(k1), lo0]
    return c


def random_bits_before(seed, offset, request, position, purpose, index):
    request = np.asarray(request, dtype=np.uint32)
    position = np.asarray(position, dtype=np.uint32)
    index = np.asarray(index, dtype=np.uint32)
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    words = philox_before(index >> np.uint32(2), (np.uint32(purpose) << np.uint32(16)) | position,
                          request, np.uint32(int(offset) & 0xFFFFFFFF), seed & 0xFFFFFFFF, seed >> 32)
    lane = index & np.uint32(3)
    out = words[3]
    for k in (2, 1, 0):
        out = np.where(lane == k, words[k], out)
    return out


def race_exponential_before(bits):
    return -np.log(((bits >> np.uint32(9)).astype(np.float64) + 0.5) * 2.0 ** -23)


KEYS = [(0, 0), (42, 9), (2 ** 64 - 1, 2 ** 32 - 1), (0x0123456789ABCDEF, 77), (-5, -1)]


def test_philox_matches_the_first_implementation_on_random_counters():
    rng = np.random.default_rng(11)
    c = [rng.integers(0, 2 ** 32, (3, 257), dtype=np.uint64) for _ in range(4)]
    c[0][0, :4] = [0, 1, 0xFFFFFFFF, 0x80000000]
    for k0, k1 in [(0, 0), (0xFFFFFFFF, 0xFFFFFFFF), (123456789, 987654321)]:
        new, old = philox4x32_10(*c, k0, k1), philox_before(*c, k0, k1)
        for w_new, w_old in zip(new, old):
            assert w_new.dtype == np.uint32 and w_new.shape == (3, 257)
            np.testing.assert_array_equal(w_new, w_old)


def test_philox_broadcasts_scalars_and_rows():
    words = philox4x32_10(np.arange(5), 3, np.arange(2)[:, None], 7, 1, 2)
    old = philox_before(np.arange(5), 3, np.arange(2)[:, None], 7, 1, 2)
    for w_new, w_old in zip(words, old):
        assert w_new.shape == (2, 5)
        np.testing.assert_array_equal(w_new, w_old)


@pytest.mark.parametrize("V", [1, 2, 3, 4, 5, 7, 8, 33, 1000, 51865])
def test_random_bits_and_whole_rows_match_the_first_implementation(V):
    rng = np.random.default_rng(V)
    request = rng.integers(0, 1000, 3)
    position = rng.integers(0, 9, 3)
    for seed, offset in KEYS:
        for purpose in (PURPOSE_ACCEPT, PURPOSE_RESIDUAL, PURPOSE_SAMPLE):
            old = random_bits_before(seed, offset, request[:, None], position[:, None], purpose, np.arange(V)[None, :])
            row = random_row_bits(seed, offset, request, position, purpose, V)
            assert row.dtype == np.uint32 and row.shape == (3, V)
            np.testing.assert_array_equal(row, old)
            np.testing.assert_array_equal(
                random_bits(seed, offset, request[:, None], position[:, None], purpose, np.arange(V)[None, :]), old)
            assert np.array_equal(race_exponential(row).view(np.uint64), race_exponential_before(old).view(np.uint64))


def test_random_row_bits_scalar_request_and_gathered_indices():
    row = random_row_bits(3, 4, 5, 6, PURPOSE_RESIDUAL, 10)
    assert row.shape == (10,)
    np.testing.assert_array_equal(row, random_bits_before(3, 4, 5, 6, PURPOSE_RESIDUAL, np.arange(10)))
    idx = np.array([[9, 0, 4], [4, 4, 1]])           # any index array, repeated and out of order
    np.testing.assert_array_equal(random_bits(3, 4, 5, 6, PURPOSE_RESIDUAL, idx),
                                  random_bits_before(3, 4, 5, 6, PURPOSE_RESIDUAL, idx))


@pytest.mark.gpu
def test_philox_on_cupy_matches_numpy():
    import cupy
    request, position = np.arange(3), np.array([0, 2, 5])
    for seed, offset in KEYS:
        host = random_row_bits(seed, offset, request, position, PURPOSE_RESIDUAL, 1001)
        dev = random_row_bits(seed, offset, cupy.asarray(request), cupy.asarray(position), PURPOSE_RESIDUAL, 1001, xp=cupy)
        np.testing.assert_array_equal(cupy.asnumpy(dev), host)
        idx = np.arange(64)[None, :]
        dev_bits = random_bits(seed, offset, cupy.asarray(request)[:, None], 1, PURPOSE_ACCEPT, cupy.asarray(idx), xp=cupy)
        np.testing.assert_array_equal(cupy.asnumpy(dev_bits), random_bits(seed, offset, request[:, None], 1, PURPOSE_ACCEPT, idx))
        # The same formula; CUDA's log and NumPy's may differ in the last bit.
        np.testing.assert_allclose(cupy.asnumpy(race_exponential(dev, xp=cupy)), race_exponential(host), rtol=1e-14)
