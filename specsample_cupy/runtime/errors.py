"""Per-request error codes shared by the kernels, the CPU reference and VerifyResult.check().

This module is the one definition of the codes: the kernels get them as the macros SS_ERR_<name>
(`MACROS` below) from the header that specsample_cupy.runtime.kernel_runtime generates for `#include "codes.cuh"`.
"""
import numpy as np

TARGET_VALUES = 1   # NaN or +Inf target logits (or invalid probabilities)
DRAFT_VALUES = 2    # NaN or +Inf draft logits (or invalid probabilities)
TOKEN_RANGE = 4     # a draft token id outside [0, V)
NO_MASS = 8         # a row with no probability mass (all -Inf logits, or no positive probability)
LENGTH = 16         # draft_lengths[b] outside [0, gamma]
TEMPERATURE = 32    # temperature[b] negative, not finite, or 0 for a method without greedy decoding

# Macro name in the generated CUDA header -> code.
MACROS = {
    "SS_ERR_TARGET": TARGET_VALUES,
    "SS_ERR_DRAFT": DRAFT_VALUES,
    "SS_ERR_TOKEN": TOKEN_RANGE,
    "SS_ERR_NO_MASS": NO_MASS,
    "SS_ERR_LENGTH": LENGTH,
    "SS_ERR_TEMPERATURE": TEMPERATURE,
}

_TEXT = {
    TARGET_VALUES: "target_logits hold NaN/+Inf (or invalid probabilities)",
    DRAFT_VALUES: "draft_logits hold NaN/+Inf (or invalid probabilities)",
    TOKEN_RANGE: "draft_tokens has ids outside [0, V)",
    NO_MASS: "a row has no probability mass (all -Inf logits or zero probabilities)",
    LENGTH: "draft_lengths outside [0, gamma]",
    TEMPERATURE: "temperature negative, not finite, or 0 for a method without greedy decoding",
}


def describe(error):
    """Human-readable message for a host array of per-request error codes, or None if all are 0."""
    error = np.asarray(error)
    bad = np.flatnonzero(error)
    if bad.size == 0:
        return None
    parts = []
    for code, text in _TEXT.items():
        reqs = [int(b) for b in bad if error[b] & code]
        if reqs:
            shown = ", ".join(map(str, reqs[:8])) + (" ..." if len(reqs) > 8 else "")
            parts.append(f"{text} in request(s) {shown}")
    return "; ".join(parts)


def raise_if_any(error):
    message = describe(error)
    if message:
        raise ValueError(message)
