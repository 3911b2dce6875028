"""ONNX Runtime sessions as the decoders open them: whether CUDA is usable (CuPy and the CUDA execution
provider), the session on a CuPy stream with optional CUDA-graph capture, a load error named by its file,
and the run options of every decoder run."""
from __future__ import annotations

import contextlib
import functools
import sys
from pathlib import Path

import numpy as np


@functools.lru_cache(maxsize=None)
def cuda_status() -> tuple[bool, str]:
    """(usable, why not): whether CuPy sees a CUDA device and ONNX Runtime has its CUDA execution provider.

    Only the expected ways of lacking a GPU answer False: a package that is not installed (ImportError) and
    a CUDA runtime error from CuPy (no device, no or too old a driver). Anything else is a broken install
    or a bug and propagates, rather than silently turning into "run on the CPU"."""
    try:
        import cupy
    except ImportError as exc:
        return False, f"CuPy is not installed ({exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        return False, f"CUDA runtime: {exc}"
    if count < 1:
        return False, "CuPy sees no CUDA device"
    try:
        import onnxruntime as ort
    except ImportError as exc:
        return False, f"onnxruntime is not installed ({exc})"
    _preload_cuda_libraries(ort)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False, "onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu, not onnxruntime)"
    return True, ""


def cuda_available() -> bool:
    """True if CuPy sees a CUDA device and ONNX Runtime has its CUDA execution provider (see cuda_status)."""
    return cuda_status()[0]


def _preload_cuda_libraries(ort):
    # onnxruntime-gpu wheels find the CUDA/cuDNN libraries of the pip packages only after this call.
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except OSError as exc:   # a library that could not be loaded: say so, the session may still work
            import warnings
            warnings.warn(f"onnxruntime.preload_dlls() could not load a CUDA library: {exc}", RuntimeWarning,
                          stacklevel=2)


def array_module(device: str):
    if device == "cuda":
        import cupy
        return cupy
    if device == "cpu":
        return np
    raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")


def onnx_load_errors() -> tuple[type, ...]:
    """The exceptions ONNX Runtime raises when creating a session from a model file it cannot load:
    InvalidProtobuf (garbage, truncated, all-zero file), InvalidArgument (an empty file: "No graph was
    found"; a graph naming a tensor nothing produces), InvalidGraph, Fail (shape inference of a corrupt
    graph), NotImplemented (an operator or opset it lacks), NoSuchFile, and UnicodeDecodeError (its error
    text quotes corrupt, non-UTF-8 names from the file)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    return (state.InvalidProtobuf, state.InvalidArgument, state.InvalidGraph, state.Fail, state.NotImplemented,
            state.NoSuchFile, UnicodeDecodeError)


def open_session_error(path, exc: BaseException) -> ValueError | None:
    """A one-line ValueError naming `path` when `exc`, raised while creating a session, says the model file
    cannot be loaded; None for other failures (an execution provider's, a refused CUDA-graph capture),
    which the caller should let propagate."""
    if isinstance(exc, UnicodeDecodeError):
        # ONNX Runtime's error text quoted corrupt bytes from the file; the text is in exc.object.
        message = bytes(exc.object).decode("utf-8", "replace") if isinstance(exc.object, bytes) else ""
    else:
        message = str(exc)
    if not isinstance(exc, onnx_load_errors()) or "Load model from" not in message:
        return None
    detail = message.split(" failed:", 1)[-1].strip().splitlines()[0][:300] if " failed:" in message else ""
    return ValueError(f"{path}: not a loadable ONNX model ({detail or type(exc).__name__})")


def _inference_session(path: Path, device: str, stream, device_id: int, cuda_graph: bool = False,
                       cpu_threads: int | None = None, weights_dir: Path | None = None):
    """An ONNX Runtime session; on CUDA it computes on `stream`, and with cuda_graph=True it may capture
    runs as CUDA graphs (ONNX Runtime refuses at creation when the graph has nodes on the CPU).
    cpu_threads: on the CPU, the threads one run may use (None: ONNX Runtime's default, every core);
    processes sharing a machine (Ray workers) each get their share, or their threads contend.
    weights_dir: where the model's external data lies, when not beside it (a rewritten graph in a
    cache folder: builder_graph.for_fixed_bindings)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if device == "cpu":
        if cpu_threads:
            options.intra_op_num_threads, options.inter_op_num_threads = int(cpu_threads), 1
        return _create_session(ort, path, options, ["CPUExecutionProvider"], weights_dir)
    _preload_cuda_libraries(ort)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise RuntimeError("device='cuda' needs onnxruntime-gpu (CUDAExecutionProvider is not available)")
    # Full float32 matrix products: TF32 (onnxruntime's default on Ampere and later) would move fp32
    # logits by ~1e-3 and make the same seed give other tokens than on the CPU.
    cuda = {"device_id": str(device_id), "user_compute_stream": str(stream.ptr), "use_tf32": "0"}
    if cuda_graph:
        cuda["enable_cuda_graph"] = "1"
    return _create_session(ort, path, options, [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"],
                           weights_dir)


def _create_session(ort, path: Path, options, providers, weights_dir: Path | None = None):
    """ort.InferenceSession, with a model file it cannot load reported as ValueError naming the file
    (open_session_error). ONNX Runtime prints its provider-fallback notices with print(); they go to
    stderr so that stdout keeps only what the command writes there. weights_dir: the model's bytes are
    loaded with that folder as the place of its external data (ONNX Runtime reads that option only for
    a model given in memory)."""
    if weights_dir is not None:
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(weights_dir))
    try:
        with contextlib.redirect_stdout(sys.stderr):
            model = str(path) if weights_dir is None else Path(path).read_bytes()
            return ort.InferenceSession(model, options, providers=providers)
    except onnx_load_errors() as exc:
        error = open_session_error(path, exc)
        if error is None:
            raise
        raise error from exc


def run_options(device: str, graph_id: int = -1):
    """Run options of every decoder run: on CUDA, return as soon as the work is enqueued on the stream
    (the decode loop syncs once per round), and name the CUDA graph to capture/replay (-1: none;
    naming it also spares onnxruntime's Python wrapper a failed lookup per run)."""
    import onnxruntime as ort
    options = ort.RunOptions()
    if device == "cuda":
        options.add_run_config_entry("disable_synchronize_execution_providers", "1")
        options.add_run_config_entry("gpu_graph_id", str(graph_id))
    return options
