"""The arguments of SpeculativeDecoder.generate() and generate_stream(), checked (ValueError) and resolved
before a call does any work: method and gamma, temperature, truncation, prompts as text or token ids.

Temperature and method "greedy": greedy decoding takes the target's argmax, as verify(method="greedy")
does whatever temperature it is given (its temperatures are then only checked). A decoding call's
temperature is the user's sampling setting, so rather than ignore it silently, generate() and
generate_stream() take method "greedy" with temperature None (the default) or 0 and refuse any other
value. temperature None means 1 for every other method.
"""
from __future__ import annotations

from numbers import Integral, Real

import numpy as np

from specsample_cupy.verification.api import METHODS as VERIFY_METHODS, ONEHOT_METHODS, SAMPLING_ONLY

METHODS = VERIFY_METHODS + ("target",)


def resolve_temperature(method: str, temperature, what: str = "temperature") -> float:
    """The temperature a call decodes at: None is 0 for method greedy and 1 otherwise; method greedy
    with another value than 0 is a ValueError (module docstring), as is a negative or infinite one."""
    if temperature is None:
        return 0.0 if method == "greedy" else 1.0
    if not isinstance(temperature, Real) or isinstance(temperature, bool) or not np.isfinite(temperature) \
            or temperature < 0:
        raise ValueError(f"{what} must be finite and >= 0, got {temperature!r}")
    if method == "greedy" and temperature != 0:
        raise ValueError(f"method 'greedy' takes the target's argmax: {what} must be 0 (or left out), "
                         f"got {temperature} (sample with method 'exact' instead)")
    if method in SAMPLING_ONLY and temperature == 0:
        raise ValueError(f"method {method!r} needs temperature > 0; use method='greedy'")
    return float(temperature)


def check_call(method, max_new_tokens, gamma, ngram: bool):
    """ValueError for an unknown method, a method the drafter cannot verify, or a bad gamma / budget."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if ngram and method not in ONEHOT_METHODS + ("target",):
        raise ValueError(f"draft='ngram' verifies one-hot drafts: method must be one of "
                         f"{ONEHOT_METHODS + ('target',)}, got {method!r}")
    if not isinstance(gamma, Integral) or isinstance(gamma, bool):
        raise ValueError(f"gamma must be an int >= 0 or 'auto', got {gamma!r}")
    if max_new_tokens < 0 or gamma < 0:
        raise ValueError("max_new_tokens and gamma must be >= 0")


def check_truncation(method, temperature, logprobs, vocab_size: int, **truncation) -> dict:
    """The active top_k / top_p / min_p (validated by verify()'s rules), as keyword arguments."""
    from specsample_cupy.verification.truncation import make_warps
    truncation = {k: v for k, v in truncation.items() if v is not None}
    active = make_warps(np, 1, vocab_size, None, float(temperature), **truncation) is not None
    if (active or logprobs) and method not in ("exact", "greedy", "target"):
        raise ValueError(f"top_k/top_p/min_p and logprobs work with methods exact, greedy and target, "
                         f"not {method!r}")
    return truncation if active else {}


def token_id_prompts(prompt_ids, vocab_size: int) -> list[list[int]]:
    """prompt_ids (a list of token-id lists, or one list of ints) as lists of ints, each id in
    [0, vocab_size); ValueError naming the prompt otherwise."""
    if len(prompt_ids) and all(isinstance(t, Integral) and not isinstance(t, bool) for t in prompt_ids):
        prompt_ids = [prompt_ids]   # one prompt's ids
    out = []
    for i, ids in enumerate(prompt_ids):
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise ValueError(f"prompt_ids[{i}] must be a list of token ids, got {type(ids).__name__}")
        ids = list(ids)
        if not all(isinstance(t, Integral) and not isinstance(t, bool) and 0 <= t < vocab_size for t in ids):
            raise ValueError(f"prompt_ids[{i}] must hold ints in [0, {vocab_size}) (the vocabulary)")
        out.append([int(t) for t in ids])
    return out
