"""Counter-based Philox4x32-10, written once for NumPy and CuPy arrays.

The GPU kernels (kernels_cu/philox.cuh) compute the same function, so the CPU reference and
the kernels consume identical random numbers. Every random number is addressed by

    key     = (seed & 0xffffffff, seed >> 32)
    counter = (index >> 2, purpose << 16 | position, request, offset)

and is lane ``index & 3`` of the four 32-bit words Philox returns for that counter. ``index``
is the draft position for acceptance uniforms and the vocabulary id for sampling races.

seed and offset may also be arrays (one per request: verify()'s `streams`); they broadcast with
the other arguments like request and position do.
"""
import sys

import numpy as np

PURPOSE_ACCEPT = 0    # u_i for the acceptance test at draft position i
PURPOSE_RESIDUAL = 1  # exponential race at the emitted position of verify()
PURPOSE_SAMPLE = 2    # exponential race of sample_tokens()

# Every purpose by name: the kernels get them as the macros SS_PURPOSE_<NAME> from the header that
# specsample_cupy.runtime.kernel_runtime generates for `#include "codes.cuh"` (this module is their one definition).
PURPOSES = {name[len("PURPOSE_"):]: value for name, value in dict(globals()).items()
            if name.startswith("PURPOSE_") and isinstance(value, int)}

_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = 0xFFFFFFFF
_LOW_HALF = 0 if sys.byteorder == "little" else 1   # which uint32 of a uint64 holds its low bits


def philox4x32_10(c0, c1, c2, c3, k0, k1, xp=np):
    """Philox4x32 with 10 rounds (Salmon et al., SC'11). Arguments broadcast (the keys too: ints, or
    arrays of one key per element); returns 4 uint32 arrays."""
    u32, u64 = xp.uint32, xp.uint64
    c = [xp.asarray(v, dtype=u32) for v in (c0, c1, c2, c3)]
    keys_per_element = not all(isinstance(k, (int, np.integer)) for k in (k0, k1))
    if keys_per_element:
        k0, k1 = (xp.asarray(k, dtype=u64) & u64(_MASK32) for k in (k0, k1))
    # Array operations are what costs in NumPy here, so a round takes three: c0 and c2 are multiplied
    # stacked as one array into 64-bit products whose 32-bit halves are read as views (no shifts or
    # masks), then the high halves cross over to the other pair: (c0, c2) = (hi1 ^ c1 ^ k0,
    # hi0 ^ c3 ^ k1), (c1, c3) = (lo1, lo0). Two product buffers alternate since the low halves
    # stay in use for a round.
    shape = (2,) + np.broadcast_shapes(*(v.shape for v in c), *((k0.shape, k1.shape) if keys_per_element else ()))
    even, odd = xp.empty(shape, u32), xp.empty(shape, u32)
    even[0], even[1], odd[0], odd[1] = c[0], c[2], c[1], c[3]
    pair = (2,) + (1,) * (len(shape) - 1)
    mul = xp.asarray([_M0, _M1], dtype=u64).reshape(pair)
    keys = _round_keys(k0, k1, len(shape) - 1, xp) if keys_per_element else _scalar_round_keys(k0, k1, pair, xp)
    products = [xp.empty(shape, u64), xp.empty(shape, u64)]
    # The halves' views, made once: on small arrays they cost as much as the arithmetic.
    halves = [p.view(u32).reshape(shape + (2,)) for p in products]
    crossed = [(h[..., 1 - _LOW_HALF][::-1], h[..., _LOW_HALF][::-1]) for h in halves]
    for r in range(10):
        xp.multiply(even, mul, out=products[r % 2])
        high, low = crossed[r % 2]
        xp.bitwise_xor(high, odd, out=even)      # even has been multiplied: free
        even ^= keys[r]
        odd = low
    return [even[0], odd[0], even[1], odd[1]]


def _scalar_round_keys(k0, k1, pair, xp):
    """[10, 2, 1, ...] uint32: the key of every round (bumped each round), one key for all elements."""
    k0, k1 = int(k0) & _MASK32, int(k1) & _MASK32
    keys = [[(k0 + r * _W0) & _MASK32, (k1 + r * _W1) & _MASK32] for r in range(10)]
    return xp.asarray(keys, dtype=xp.uint32).reshape((10,) + pair)


def _round_keys(k0, k1, ndim, xp):
    """[10, 2, ...] uint32: the key of every round for keys given per element (uint64 arrays holding
    32-bit values), their shapes padded to ndim axes so they broadcast with the counters. uint32
    additions wrap around, which is the key schedule's mod 2^32."""
    pad = lambda k: k.astype(xp.uint32).reshape((1,) * (ndim - k.ndim) + k.shape)
    k0, k1 = xp.broadcast_arrays(pad(k0), pad(k1))
    bumps = xp.asarray([[(r * _W0) & _MASK32, (r * _W1) & _MASK32] for r in range(10)], dtype=xp.uint32)
    return xp.stack([k0, k1])[None] + bumps.reshape((10, 2) + (1,) * ndim)


def _counter_words(seed, offset, request, position, purpose, counter, xp):
    """The four Philox words of counter (counter, purpose << 16 | position, request, offset); seed and
    offset ints, or int arrays (one per request) that broadcast with the rest."""
    position = xp.asarray(position, dtype=xp.uint32)
    if isinstance(seed, (int, np.integer)):
        seed = int(seed) & 0xFFFFFFFFFFFFFFFF
        k0, k1 = seed & _MASK32, seed >> 32
    else:
        seed = xp.asarray(seed).astype(xp.int64).view(xp.uint64)   # two's complement, as the kernels read it
        k0, k1 = seed & xp.uint64(_MASK32), seed >> xp.uint64(32)
    if isinstance(offset, (int, np.integer)):
        offset = xp.uint32(int(offset) & _MASK32)
    else:
        offset = (xp.asarray(offset).astype(xp.int64).view(xp.uint64) & xp.uint64(_MASK32)).astype(xp.uint32)
    return philox4x32_10(counter, (xp.uint32(purpose) << xp.uint32(16)) | position,
                         xp.asarray(request, dtype=xp.uint32), offset, k0, k1, xp=xp)


def random_bits(seed, offset, request, position, purpose, index, xp=np):
    """uint32 random words addressed as in the module docstring; arguments broadcast."""
    index = xp.asarray(index, dtype=xp.uint32)
    words = _counter_words(seed, offset, request, position, purpose, index >> xp.uint32(2), xp)
    lane = index & xp.uint32(3)
    out = words[3]
    for k in (2, 1, 0):
        out = xp.where(lane == k, words[k], out)
    return out


def random_row_bits(seed, offset, request, position, purpose, length, xp=np):
    """random_bits() for index = 0 .. length-1 along a new last axis: [*shape, length] uint32, shape
    the broadcast shape of request and position (the exponential race of a whole vocabulary row).

    Indices 4c .. 4c+3 are the four lanes of counter c, so each counter is computed once and its
    words interleaved, a quarter of the work of random_bits() over the same indices."""
    counters = xp.arange(-(-int(length) // 4), dtype=xp.uint32)
    request = xp.asarray(request, dtype=xp.uint32)[..., None]
    position = xp.asarray(position, dtype=xp.uint32)[..., None]
    seed, offset = (v if isinstance(v, (int, np.integer)) else xp.asarray(v)[..., None] for v in (seed, offset))
    words = xp.stack(_counter_words(seed, offset, request, position, purpose, counters, xp), axis=-1)
    return words.reshape(words.shape[:-2] + (-1,))[..., :length]


def acceptance_uniform(bits, xp=np):
    """[0, 1) with 24 random bits: exactly representable in float32, identical in the kernels."""
    return (bits >> xp.uint32(8)).astype(xp.float64) * 2.0 ** -24


def race_exponential(bits, xp=np, dtype=np.float64):
    """Exp(1) variates -log(U) with U = ((bits >> 9) + 0.5) * 2^-23 in (0, 1), exact in float32;
    computed in dtype (float32: the CPU reference's float32 race keys)."""
    u = (bits >> xp.uint32(9)).astype(dtype)
    u += 0.5                                  # in place: the same values without new arrays
    u *= 2.0 ** -23
    xp.log(u, out=u)
    return xp.negative(u, out=u)
