"""cuda_status()/cuda_available(): the expected ways of lacking a GPU answer False with a reason; any other
error propagates instead of silently choosing the CPU. CuPy and ONNX Runtime are replaced by fakes."""
import sys
import types

import pytest
from click.testing import CliRunner

from specsample_cupy.runtime import ort_session as sessions


class FakeCudaRuntimeError(Exception):
    """Stands in for cupy.cuda.runtime.CUDARuntimeError."""


def _fake_cupy(get_device_count):
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(
        CUDARuntimeError=FakeCudaRuntimeError, getDeviceCount=get_device_count))
    return cupy


def _fake_ort(providers):
    ort = types.ModuleType("onnxruntime")
    ort.get_available_providers = lambda: list(providers)
    return ort


def _raise(exc):
    def f():
        raise exc
    return f


@pytest.fixture(autouse=True)
def fresh_cache():
    sessions.cuda_status.cache_clear()
    yield
    sessions.cuda_status.cache_clear()


def _use(monkeypatch, cupy=None, ort=None):
    monkeypatch.setitem(sys.modules, "cupy", cupy)            # None makes `import cupy` raise ImportError
    monkeypatch.setitem(sys.modules, "onnxruntime", ort)


def test_no_cupy(monkeypatch):
    _use(monkeypatch, None, _fake_ort(["CUDAExecutionProvider"]))
    usable, why = sessions.cuda_status()
    assert not usable and "CuPy is not installed" in why
    assert sessions.cuda_available() is False


def test_cuda_runtime_error(monkeypatch):
    _use(monkeypatch, _fake_cupy(_raise(FakeCudaRuntimeError("cudaErrorNoDevice: no CUDA-capable device"))),
         _fake_ort(["CUDAExecutionProvider"]))
    usable, why = sessions.cuda_status()
    assert not usable and "cudaErrorNoDevice" in why


def test_no_device(monkeypatch):
    _use(monkeypatch, _fake_cupy(lambda: 0), _fake_ort(["CUDAExecutionProvider"]))
    assert sessions.cuda_status() == (False, "CuPy sees no CUDA device")


def test_no_onnxruntime(monkeypatch):
    _use(monkeypatch, _fake_cupy(lambda: 1), None)
    usable, why = sessions.cuda_status()
    assert not usable and "onnxruntime is not installed" in why


def test_cpu_only_onnxruntime(monkeypatch):
    _use(monkeypatch, _fake_cupy(lambda: 1), _fake_ort(["CPUExecutionProvider"]))
    usable, why = sessions.cuda_status()
    assert not usable and "onnxruntime-gpu" in why


def test_usable(monkeypatch):
    _use(monkeypatch, _fake_cupy(lambda: 2), _fake_ort(["CUDAExecutionProvider", "CPUExecutionProvider"]))
    assert sessions.cuda_status() == (True, "")
    assert sessions.cuda_available() is True


@pytest.mark.parametrize("error", [RuntimeError("driver crashed"), AttributeError("broken install"),
                                   KeyError("bug")])
def test_unexpected_errors_propagate(monkeypatch, error):
    _use(monkeypatch, _fake_cupy(_raise(error)), _fake_ort(["CUDAExecutionProvider"]))
    with pytest.raises(type(error)):
        sessions.cuda_status()


def test_unexpected_provider_query_error_propagates(monkeypatch):
    ort = _fake_ort([])
    ort.get_available_providers = _raise(OSError("libcudnn.so.9: cannot open shared object file"))
    _use(monkeypatch, _fake_cupy(lambda: 1), ort)
    with pytest.raises(OSError):
        sessions.cuda_status()


def test_decode_says_why_it_runs_on_the_cpu(monkeypatch):
    from specsample_cupy.cli.decode import resolve_device

    monkeypatch.setattr(sessions, "cuda_status", lambda: (False, "CuPy sees no CUDA device"))
    try:
        runner = CliRunner(mix_stderr=False)
    except TypeError:            # click >= 8.2 keeps stderr apart anyway
        runner = CliRunner()
    import click

    @click.command()
    def show():
        click.echo(resolve_device(None))

    result = runner.invoke(show)
    assert result.stdout == "cpu\n"
    assert "No usable CUDA device (CuPy sees no CUDA device); running on the CPU." in result.stderr
