"""Fail before working (specsample_cupy/cli/paths.py): an output path that cannot be written fails
`generate`, `bench decode`, `bench verify` and `eval` in well under a second, before any model loads,
with one line on stderr and a non-zero exit; a write that fails at the end is one line too, never a
traceback. The bench commands run under `specsample` itself (click caches a command's help option
from the first context it meets). Paths under /proc stand for unwritable ones: CI runs as root, for
whom a read-only folder's permission bits are no obstacle."""
import json
import time

import pytest

pytest.importorskip("onnxruntime")

from helpers_cli import split_runner  # noqa: E402
from specsample_cupy.cli import generate as cli_generate  # noqa: E402
from cli import main  # noqa: E402
from specsample_cupy.cli.eval import eval_group  # noqa: E402
from specsample_cupy.cli.paths import why_not_writable  # noqa: E402

UNWRITABLE = ["/proc/specsample-test.json", "/proc/no-such-folder/out.json", "/proc/version"]


def _fails_fast(command, args):
    """The command fails with one line on stderr, a non-zero exit and no traceback, within a second."""
    started = time.perf_counter()
    result = split_runner().invoke(command, args)
    elapsed = time.perf_counter() - started
    assert result.exit_code not in (0, None) and result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert elapsed < 1.0, elapsed
    return lines[0]


@pytest.fixture
def no_loading(monkeypatch):
    """Any model load fails the test."""
    from specsample_cupy.bench import decode as bench_decode
    from specsample_cupy.decode import decoder
    loaded = lambda *a, **k: pytest.fail("a model was loaded")
    monkeypatch.setattr(cli_generate, "load_decoder", loaded)
    monkeypatch.setattr(bench_decode, "load_decoder", loaded)
    monkeypatch.setattr(decoder.SpeculativeDecoder, "__init__", loaded)


def test_what_counts_as_writable(tmp_path):
    assert why_not_writable(str(tmp_path / "new.json")) is None
    (tmp_path / "old.json").write_text("kept")
    assert why_not_writable(str(tmp_path / "old.json")) is None and (tmp_path / "old.json").read_text() == "kept"
    assert why_not_writable(str(tmp_path)) == "it is a folder"
    assert "does not exist" in why_not_writable(str(tmp_path / "a" / "b.json"))
    assert why_not_writable(str(tmp_path / "a" / "b.json"), make_parents=True) is None
    assert list(tmp_path.iterdir()) == [tmp_path / "old.json"]   # the probes left nothing behind
    for path in UNWRITABLE:
        assert why_not_writable(path, make_parents=True) is not None, path


@pytest.mark.parametrize("path", UNWRITABLE, ids=["proc-file", "proc-folder", "proc-existing"])
def test_generate_output(pair, tmp_path, no_loading, path):
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"id": 1, "prompt": "a"}) + "\n")
    line = _fails_fast(cli_generate.generate, ["--target", pair[0], "--draft", pair[1], "--device", "cpu",
                                               "--input", str(source), "--output", path])
    assert line.startswith(f"Error: --output {path}: cannot write it")


@pytest.mark.parametrize("option", ["--json", "--plot"])
@pytest.mark.parametrize("path", UNWRITABLE[:2])
def test_bench_decode_outputs(pair, no_loading, option, path):
    line = _fails_fast(main, ["bench", "decode", "--target", pair[0], "--draft", pair[1], "--device", "cpu",
                              option, path])
    assert line.startswith(f"Error: {option} {path}: cannot write it")


def test_bench_verify_json(no_loading):
    line = _fails_fast(main, ["bench", "verify", "--device", "cpu", "--json", UNWRITABLE[1]])
    assert "--json" in line


@pytest.mark.parametrize("task", ["summarize", "asr"])
@pytest.mark.parametrize("option", ["--json", "--plot"])
def test_eval_outputs(pair, tmp_path, no_loading, task, option):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"article": "a b c", "summary": "a", "audio": "x.wav", "text": "a"}) + "\n")
    line = _fails_fast(eval_group, [task, "--target", pair[0], "--draft", pair[1], "--data", str(data),
                                    option, UNWRITABLE[0], "--device", "cpu"])
    assert line.startswith(f"Error: {option} {UNWRITABLE[0]}: cannot write it")


def test_a_write_failing_at_the_end_is_one_line(pair, tmp_path, monkeypatch):
    """A report whose write fails after the work (the disk filled meanwhile): one line, no traceback."""
    pytest.importorskip("rouge_score")
    from specsample_cupy.tasks import evaluation

    def full_disk(path, report):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(evaluation, "write_json", full_disk)
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"article": "a b c", "summary": "a"}) + "\n")
    result = split_runner().invoke(eval_group, ["summarize", "--target", pair[0], "--draft", pair[1], "--data",
                                                str(data), "--methods", "exact", "--max-new-tokens", "2", "--json",
                                                str(tmp_path / "r.json"), "--device", "cpu", "--no-progress"])
    assert result.exit_code == 1 and result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stderr.strip().splitlines() == [f"Error: {tmp_path / 'r.json'}: No space left on device"]
