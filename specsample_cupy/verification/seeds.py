"""Each request's own random stream: a seed derived from the run's base seed and the request's identity.

Rule: in a run (a generate() call, a generate_stream() call, a `specsample generate` run) with base
seed S, the request with key k draws every random number with the Philox key request_seed(S, k),
counted from its own first round (verify()'s `streams`), so its tokens depend neither on its row nor on
the requests decoded with it; a request that brings its own seed s draws with s itself. The key is the
request's index in a generate() / generate_stream() call, and key_of_id(id) for an id of
`specsample generate`'s input (a hash of its JSON, so a resumed or reordered file keeps every request's
stream).

request_seed(S, 0) is S itself: a one-prompt call with seed s, and a request with its own seed s, draw
the same numbers (`decode --prompt P --seed s` reproduces a line whose "seed" is s). Every other key
goes through two rounds of splitmix64's finaliser, base first: mix(mix(S) + k * golden), so nearby
bases and keys land far apart, and base + index arithmetic cannot make one run's request collide with
another run's (base S', key k') except by a 64-bit accident. The result has 63 bits, so it is also a
valid int64 and a plain JSON integer.
"""
from __future__ import annotations

import hashlib
import json
import secrets
from numbers import Integral

import numpy as np

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15   # splitmix64's increment: 2^64 / the golden ratio, odd
BASE_DOMAIN = 0x5EED5EED5EED5EED   # keeps mix(S) away from splitmix64's own sequence of S


def _mix64(z: int) -> int:
    """splitmix64's finaliser (Steele, Lea and Flood 2014): a bijection of 64-bit ints with full avalanche."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def check_seed(seed, what: str = "seed") -> int:
    """seed as an int (a bool, float or str is a ValueError naming `what`)."""
    if not isinstance(seed, Integral) or isinstance(seed, bool):
        raise ValueError(f"{what} must be an int, got {seed!r}")
    return int(seed)


def random_base_seed() -> int:
    """A base seed from the operating system's randomness (63 bits, like a derived seed)."""
    return secrets.randbits(63)


def request_seed(base: int, key: int) -> int:
    """The seed of the request with key `key` in a run whose base seed is `base` (module docstring)."""
    key = int(key) & MASK64
    if key == 0:
        return int(base)
    z = _mix64(((int(base) & MASK64) ^ BASE_DOMAIN))
    return _mix64((z + key * GOLDEN) & MASK64) >> 1


def key_of_id(request_id) -> int:
    """A request id's key: the first 8 bytes of the SHA-256 of its JSON (ids compare by their JSON)."""
    text = json.dumps(request_id, ensure_ascii=False)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")


def resolve_seeds(seed, seeds, count: int) -> tuple[int, list[int]]:
    """(base seed, each request's seed) for a call of `count` requests: seed None draws a base from the
    operating system; seeds None, or a list of ints / None (request i's own seed, or None to derive
    it from the base and i). ValueError for a bad seed or a list of the wrong length."""
    base = random_base_seed() if seed is None else check_seed(seed)
    if seeds is None:
        return base, [request_seed(base, i) for i in range(count)]
    seeds = list(seeds)
    if len(seeds) != count:
        raise ValueError(f"seeds must hold one seed (or None) per request: {count}, got {len(seeds)}")
    return base, [request_seed(base, i) if s is None else check_seed(s, f"seeds[{i}]") for i, s in enumerate(seeds)]


def as_int64(seeds) -> np.ndarray:
    """Seeds as int64 (two's complement of their low 64 bits: what the kernels and runtime/philox.py read)."""
    return np.array([int(s) & MASK64 for s in seeds], np.uint64).view(np.int64)
