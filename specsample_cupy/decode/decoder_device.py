"""Where a SpeculativeDecoder runs: the device it picks, the session it opens for each model, and what
a model that cannot run with fixed bindings raises."""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

from specsample_cupy.runtime.model_folder import ModelSpec
from specsample_cupy.runtime.ort_session import cuda_available
from specsample_cupy.runtime.sessions import DecoderSession
from specsample_cupy.runtime.sessions_static import StaticDecoderSession


def caller_stacklevel() -> int:
    """warnings.warn's stacklevel, from the function that calls this, of the first frame outside this
    package: a warning then points at the user's line, whichever of our functions (and subclasses'
    constructors) led to it."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level


CPU_FALLBACK_WARNING = "no CUDA device usable by CuPy and onnxruntime-gpu; decoding on the CPU"


def pick_device(device: str | None) -> str:
    if device is None:
        if cuda_available():
            return "cuda"
        warnings.warn(CPU_FALLBACK_WARNING, RuntimeWarning, stacklevel=caller_stacklevel())
        return "cpu"
    if device == "cuda" and not cuda_available():
        raise RuntimeError("device='cuda' needs CuPy, a CUDA device and onnxruntime-gpu's CUDAExecutionProvider")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    return device


def default_model_dir(role: str) -> Path:
    """The embedded pair, models/stdlib-code/{target,draft}, next to the installed models package."""
    import importlib

    from specsample_cupy.runtime.layout import package_name
    models = importlib.import_module(package_name("models"))
    return Path(models.__file__).resolve().parent / "stdlib-code" / role


def opened_folder(folder, role: str, batch_layout: bool):
    """The folder a decoder loads for `folder` (None: the embedded pair's model for `role`): with
    batch_layout, an ONNX Runtime GenAI builder folder's conversion (convert/cache.batching_folder), or,
    where the converter refuses it, the folder as it comes, with a RuntimeWarning saying why."""
    folder = folder if folder is not None else default_model_dir(role)
    if not batch_layout:
        return folder
    from specsample_cupy.convert.cache import batching_folder
    path, refusal = batching_folder(folder)
    if refusal is not None:
        warnings.warn(refusal, RuntimeWarning, stacklevel=caller_stacklevel())
    return path


def graph_refusals() -> tuple:
    """What a StaticDecoderSession raises for a model it cannot run with fixed bindings: our own
    ValueError (no position_ids, a use_cache_branch input) and ONNX Runtime's refusal to capture."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors
    return (ValueError, ort_errors.Fail, ort_errors.RuntimeException, ort_errors.NotImplemented, ort_errors.EPFail)


def open_session(dec, spec, role, device_id, cuda_graphs):
    """Decoder dec's session for one model: a StaticDecoderSession (fixed bindings, CUDA-graph replay)
    where the device and the model allow it; the same bindings without graphs for a model ONNX Runtime
    will not capture (nodes on the CPU); else a DecoderSession. dec.cuda_graphs[role] says whether runs
    are captured, or why not."""
    if dec.device == "cuda" and cuda_graphs:
        try:
            session = StaticDecoderSession(spec, dec.device, dec.stream, device_id)
            dec.cuda_graphs[role] = True
            return session
        except graph_refusals() as e:   # e.g. ONNX Runtime cannot capture a graph with CPU nodes
            dec.cuda_graphs[role] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            converted = _open_converted(dec, spec, role, device_id)
            if converted is not None:
                return converted
            if not isinstance(e, ValueError):   # the model itself suits fixed bindings
                try:
                    return StaticDecoderSession(spec, dec.device, dec.stream, device_id, capture=False)
                except graph_refusals():
                    pass
    else:
        dec.cuda_graphs[role] = "off" if dec.device == "cuda" else "cpu"
    return DecoderSession(spec, dec.device, dec.stream, device_id, cpu_threads=dec.cpu_threads)


def _open_converted(dec, spec, role, device_id):
    """For an ONNX export the converter reads (optimum's, of a Llama-family model) whose own graph
    cannot be captured: a StaticDecoderSession on its conversion, made once into a cache folder
    (convert/cache.py); None when it is not such an export or its conversion fails to load too."""
    from specsample_cupy.convert.cache import converted_copy, convertible
    if not convertible(spec.model_dir):
        return None
    try:
        session = StaticDecoderSession(ModelSpec.from_dir(converted_copy(spec.model_dir)), dec.device,
                                       dec.stream, device_id)
    except graph_refusals() as e:   # ConversionError is a ValueError
        dec.cuda_graphs[role] += f"; its conversion: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        return None
    dec.cuda_graphs[role] = True
    return session
