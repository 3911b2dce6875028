"""Where a SpeculativeDecoder runs: the device it picks, and what a model that cannot run with fixed
bindings raises."""
from __future__ import annotations

import os
import sys
import warnings

from specsample_cupy.runtime.ort_session import cuda_available


def caller_stacklevel() -> int:
    """warnings.warn's stacklevel, from the function that calls this, of the first frame outside this
    package: a warning then points at the user's line, whichever of our functions (and subclasses'
    constructors) led to it."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def pick_device(device: str | None) -> str:
    if device is None:
        if cuda_available():
            return "cuda"
        warnings.warn("no CUDA device usable by CuPy and onnxruntime-gpu; decoding on the CPU", RuntimeWarning,
                      stacklevel=caller_stacklevel())
        return "cpu"
    if device == "cuda" and not cuda_available():
        raise RuntimeError("device='cuda' needs CuPy, a CUDA device and onnxruntime-gpu's CUDAExecutionProvider")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    return device


def graph_refusals() -> tuple:
    """What a StaticDecoderSession raises for a model it cannot run with fixed bindings: our own
    ValueError (no position_ids, a use_cache_branch input) and ONNX Runtime's refusal to capture."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors
    return (ValueError, ort_errors.Fail, ort_errors.RuntimeException, ort_errors.NotImplemented, ort_errors.EPFail)
