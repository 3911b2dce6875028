import numpy as np

from specsample_cupy.philox import (PURPOSE_ACCEPT, acceptance_uniform, philox4x32_10,
                                    race_exponential, random_bits)


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
