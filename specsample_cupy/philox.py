"""Counter-based Philox4x32-10, written once for NumPy and CuPy arrays.

The GPU kernels (kernels_cu/philox.cuh) compute the same function, so the CPU reference and
the kernels consume identical random numbers. Every random number is addressed by

    key     = (seed & 0xffffffff, seed >> 32)
    counter = (index >> 2, purpose << 16 | position, request, offset)

and is lane ``index & 3`` of the four 32-bit words Philox returns for that counter. ``index``
is the draft position for acceptance uniforms and the vocabulary id for sampling races.
"""
import numpy as np

PURPOSE_ACCEPT = 0    # u_i for the acceptance test at draft position i
PURPOSE_RESIDUAL = 1  # exponential race at the emitted position of verify()
PURPOSE_SAMPLE = 2    # exponential race of sample_tokens()

# Every purpose by name: the kernels get them as the macros SS_PURPOSE_<NAME> from the header that
# specsample_cupy.kernels generates for `#include "codes.cuh"` (this module is their one definition).
PURPOSES = {name[len("PURPOSE_"):]: value for name, value in dict(globals()).items()
            if name.startswith("PURPOSE_") and isinstance(value, int)}

_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = 0xFFFFFFFF


def philox4x32_10(c0, c1, c2, c3, k0, k1, xp=np):
    """Philox4x32 with 10 rounds (Salmon et al., SC'11). Arguments broadcast; returns 4 uint32 arrays."""
    u32, u64 = xp.uint32, xp.uint64
    c = [xp.asarray(v, dtype=u32) for v in (c0, c1, c2, c3)]
    k0 = int(k0) & _MASK32
    k1 = int(k1) & _MASK32
    for r in range(10):
        if r:
            k0 = (k0 + _W0) & _MASK32
            k1 = (k1 + _W1) & _MASK32
        p0 = c[0].astype(u64) * u64(_M0)
        p1 = c[2].astype(u64) * u64(_M1)
        hi0, lo0 = (p0 >> u64(32)).astype(u32), (p0 & u64(_MASK32)).astype(u32)
        hi1, lo1 = (p1 >> u64(32)).astype(u32), (p1 & u64(_MASK32)).astype(u32)
        c = [hi1 ^ c[1] ^ u32(k0), lo1, hi0 ^ c[3] ^ u32(k1), lo0]
    return c


def random_bits(seed, offset, request, position, purpose, index, xp=np):
    """uint32 random words addressed as in the module docstring; arguments broadcast."""
    request = xp.asarray(request, dtype=xp.uint32)
    position = xp.asarray(position, dtype=xp.uint32)
    index = xp.asarray(index, dtype=xp.uint32)
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    words = philox4x32_10(index >> xp.uint32(2), (xp.uint32(purpose) << xp.uint32(16)) | position,
                          request, xp.uint32(int(offset) & _MASK32), seed & _MASK32, seed >> 32, xp=xp)
    lane = index & xp.uint32(3)
    out = words[3]
    for k in (2, 1, 0):
        out = xp.where(lane == k, words[k], out)
    return out


def acceptance_uniform(bits, xp=np):
    """[0, 1) with 24 random bits: exactly representable in float32, identical in the kernels."""
    return (bits >> xp.uint32(8)).astype(xp.float64) * 2.0 ** -24


def race_exponential(bits, xp=np):
    """Exp(1) variates -log(U) with U = ((bits >> 9) + 0.5) * 2^-23 in (0, 1), exact in float32."""
    u = ((bits >> xp.uint32(9)).astype(xp.float64) + 0.5) * 2.0 ** -23
    return -xp.log(u)
