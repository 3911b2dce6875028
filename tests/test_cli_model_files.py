"""A damaged file in a model directory is reported in one line that names it: ValueError from the
library, `Error: ...` and exit status 1 from the CLI, never a traceback and nothing on stdout."""
import json
import shutil

import pytest

pytest.importorskip("onnxruntime")


from specsample_cupy.cli.decode import decode  # noqa: E402
from specsample_cupy.decode.decoder import default_model_dir  # noqa: E402
from specsample_cupy.runtime.model_folder import ModelSpec  # noqa: E402
from specsample_cupy.runtime.ort_session import open_session_error  # noqa: E402
from specsample_cupy.runtime.sessions import DecoderSession  # noqa: E402


from helpers_cli import split_runner as _runner  # noqa: E402


def _corrupt(tmp_path, name, content: bytes | None = None, transform=None):
    """A copy of the embedded target with one file replaced by `content` or transform(old bytes)."""
    d = shutil.copytree(default_model_dir("target"), tmp_path / "target")
    path = d / name
    path.write_bytes(content if transform is None else transform(path.read_bytes()))
    return d, path


def _graph_with_missing_tensor(data: bytes) -> bytes:
    onnx = pytest.importorskip("onnx")
    model = onnx.load_from_string(data)
    model.graph.node[5].input[0] = "no_such_tensor"
    return model.SerializeToString()


def _corrupt_name(data: bytes) -> bytes:
    """One node's reference to the first weight gets a non-UTF-8 byte: ONNX Runtime's error text quotes it
    and its Python binding then raises UnicodeDecodeError."""
    onnx = pytest.importorskip("onnx")
    name = onnx.load_from_string(data).graph.initializer[0].name.encode()
    i = data.index(name)
    return data[:i] + b"\xff" + data[i + 1:]


MODEL_CASES = {
    "garbage": dict(content=b"this is not an ONNX model\n" * 20, match="Protobuf parsing failed"),
    "truncated": dict(transform=lambda b: b[:len(b) // 2], match="Protobuf parsing failed"),
    "empty": dict(content=b"", match="No graph was found"),
    "missing tensor": dict(transform=_graph_with_missing_tensor, match="no_such_tensor"),
    "corrupt name": dict(transform=_corrupt_name, match="is not a graph input"),
}
SPEC_CASES = {
    ("config.json", "garbage"): dict(content=b"{vocab_size: 2048", match="not valid JSON"),
    ("config.json", "truncated"): dict(transform=lambda b: b[:len(b) // 2], match="not valid JSON"),
    ("config.json", "not an object"): dict(content=b"[2048]", match="expected a JSON object"),
    ("config.json", "binary"): dict(content=bytes(range(256)), match="not UTF-8"),
    ("config.json", "bad vocab"): dict(content=json.dumps({"vocab_size": "2048"}).encode(),
                                       match="vocab_size must be a positive integer"),
    ("generation_config.json", "garbage"): dict(content=b"eos=0", match="not valid JSON"),
    ("generation_config.json", "bad id"): dict(content=b'{"eos_token_id": "0"}', match="eos_token_id must be"),
    ("tokenizer.json", "garbage"): dict(content=b"not a tokenizer", match="not a valid tokenizers file"),
    ("tokenizer.json", "truncated"): dict(transform=lambda b: b[:len(b) // 2], match="not a valid tokenizers file"),
}


@pytest.mark.parametrize("case", MODEL_CASES)
def test_unloadable_onnx_file_is_a_value_error_naming_it(tmp_path, case):
    kwargs = dict(MODEL_CASES[case])
    match = kwargs.pop("match")
    d, path = _corrupt(tmp_path, "model.onnx", **kwargs)
    spec = ModelSpec.from_dir(d)   # the ONNX file is read when a session opens it
    with pytest.raises(ValueError, match=match) as info:
        DecoderSession(spec)
    message = str(info.value)
    assert message.startswith(f"{path}: not a loadable ONNX model (") and "\n" not in message


@pytest.mark.parametrize("name,case", SPEC_CASES)
def test_bad_spec_file_is_a_value_error_naming_it(tmp_path, name, case):
    kwargs = dict(SPEC_CASES[name, case])
    match = kwargs.pop("match")
    d, path = _corrupt(tmp_path, name, **kwargs)
    with pytest.raises(ValueError, match=match) as info:
        ModelSpec.from_dir(d)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)


@pytest.mark.parametrize("name,case", [("model.onnx", c) for c in ("garbage", "truncated", "corrupt name")]
                         + [("config.json", "garbage"), ("tokenizer.json", "garbage")])
def test_cli_prints_one_error_line_and_nothing_on_stdout(tmp_path, name, case):
    kwargs = dict((MODEL_CASES[case] if name == "model.onnx" else SPEC_CASES[name, case]))
    kwargs.pop("match")
    d, path = _corrupt(tmp_path, name, **kwargs)
    result = _runner().invoke(decode, ["--target", str(d), "--draft", str(default_model_dir("draft")),
                                       "--prompt", "import os", "--device", "cpu"])
    assert result.exit_code == 1
    assert result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and errors[0].startswith(f"Error: {path}: "), result.stderr
    assert "Traceback" not in result.stderr


def test_session_errors_that_are_not_about_the_file_are_left_alone():
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    assert open_session_error("m.onnx", state.Fail("CUDA graph capture needs every node on the GPU")) is None
    assert open_session_error("m.onnx", RuntimeError("Load model from m.onnx failed: out of memory")) is None
    error = open_session_error("m.onnx", state.InvalidProtobuf(
        "[ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Load model from m.onnx failed:Protobuf parsing failed."))
    assert str(error) == "m.onnx: not a loadable ONNX model (Protobuf parsing failed.)"
