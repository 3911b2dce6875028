"""The smaller points of issue #36, on the CPU: `decode --gamma auto`; method greedy with a temperature
refused (decode/call_args.py: verify(method="greedy") takes the argmax whatever its temperature, so the
decoding calls refuse one rather than ignore it); seed=None; prompts as token ids; the CPU warning
pointing at the caller; `generate --strict`; Ctrl-C's resume hint."""
import json
import warnings

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from helpers_cli import split_runner  # noqa: E402
from specsample_cupy import verify  # noqa: E402
from specsample_cupy.batch import runner as generate_run
from specsample_cupy.cli.decode import decode  # noqa: E402
from specsample_cupy.cli.generate import generate  # noqa: E402
from specsample_cupy.decode.continuous import StreamRequest  # noqa: E402
from specsample_cupy.decode.decoder import SpeculativeDecoder  # noqa: E402
from specsample_cupy.runtime.ort_session import cuda_available  # noqa: E402


@pytest.fixture(scope="module")
def dec(pair):
    return SpeculativeDecoder(*pair, device="cpu")


def _models(pair):
    return ["--target", pair[0], "--draft", pair[1], "--device", "cpu"]


def test_decode_takes_gamma_auto(pair):
    result = split_runner().invoke(decode, _models(pair) + ["--prompt", "the sea", "--gamma", "auto",
                                                            "--max-new-tokens", "6", "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["stats"]["gamma_mode"] == "auto"
    bad = split_runner().invoke(decode, _models(pair) + ["--prompt", "a", "--gamma", "-1"])
    assert bad.exit_code == 2 and "neither an integer >= 0 nor 'auto'" in bad.stderr


def test_greedy_refuses_a_temperature_everywhere(pair, dec, tmp_path):
    greedy = dec.generate(["the sea"], max_new_tokens=6, method="greedy")   # left out: greedy at 0
    assert greedy.token_ids == dec.generate(["the sea"], max_new_tokens=6, method="greedy", temperature=0).token_ids
    with pytest.raises(ValueError, match="method 'greedy' takes the target's argmax: temperature must be 0"):
        dec.generate(["the sea"], method="greedy", temperature=0.7)
    with pytest.raises(ValueError, match="request 0: temperature must be 0"):
        dec.generate_stream([StreamRequest("a", 4, temperature=0.7)], method="greedy")
    result = split_runner().invoke(decode, _models(pair) + ["--prompt", "a", "--method", "greedy", "--temperature",
                                                            "0.7"])
    assert result.exit_code == 2 and "--temperature must be 0 (or left out), got 0.7" in result.stderr
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"id": 1, "prompt": "a", "temperature": 0.7}) + "\n" +
                      json.dumps({"id": 2, "prompt": "a"}) + "\n")
    result = split_runner().invoke(generate, _models(pair) + ["--input", str(source), "--output",
                                                              str(tmp_path / "out.jsonl"), "--method", "greedy",
                                                              "--no-progress"])
    assert result.exit_code == 0 and "which takes the argmax (0 only); skipped" in result.stderr
    assert [json.loads(x)["temperature"] for x in (tmp_path / "out.jsonl").read_text().splitlines()] == [0.0]


def test_seed_none_everywhere(dec):
    out = dec.generate(["a", "a"], max_new_tokens=4, seed=None)
    assert isinstance(out.stats["seed"], int) and out.stats["seeds"][0] == out.stats["seed"]
    stream = dec.generate_stream(["a"], seed=None, gamma=2)
    assert list(stream)[0].stats["seed"] == stream.stats["seed"]
    rng = np.random.default_rng(0)
    res = verify(rng.integers(0, 8, (2, 3)), rng.normal(size=(2, 3, 8)), rng.normal(size=(2, 4, 8)), seed=None)
    assert (res.emitted >= 1).all()


def test_prompts_as_token_ids(dec):
    ids = dec.target_spec.encode("the sea")
    by_text = dec.generate(["the sea", "a"], max_new_tokens=6, seed=3)
    by_ids = dec.generate(prompt_ids=[ids, dec.target_spec.encode("a")], max_new_tokens=6, seed=3)
    assert by_ids.token_ids == by_text.token_ids
    assert dec.generate(prompt_ids=ids, max_new_tokens=6, seed=3).token_ids == by_text.token_ids[:1]
    with pytest.raises(ValueError, match="one of them"):
        dec.generate(["a"], prompt_ids=[ids])
    with pytest.raises(ValueError, match=r"prompt_ids\[0\] must hold ints in \[0, 48\)"):
        dec.generate(prompt_ids=[[1, 48]])
    with pytest.raises(ValueError, match=r"prompt_ids\[0\] must be a list of token ids"):
        dec.generate(prompt_ids=["the sea"])


@pytest.mark.skipif(cuda_available(), reason="a CUDA device is present: no CPU warning")
def test_the_cpu_warning_points_at_the_caller(pair):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        SpeculativeDecoder(*pair)
    assert [w.filename for w in caught if issubclass(w.category, RuntimeWarning)] == [__file__]


def test_strict_fails_when_a_line_was_rejected(pair, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"id": 1, "prompt": "a"}) + "\nnot json\n")
    args = _models(pair) + ["--input", str(source), "--max-new-tokens", "3", "--no-progress"]
    lenient = split_runner().invoke(generate, args + ["--output", str(tmp_path / "a.jsonl")])
    assert lenient.exit_code == 0, lenient.stderr
    strict = split_runner().invoke(generate, args + ["--output", str(tmp_path / "b.jsonl"), "--strict"])
    assert strict.exit_code == 1 and strict.stderr.strip().endswith(
        "Error: --strict: 1 request(s) not generated (reported above)")
    assert len((tmp_path / "b.jsonl").read_text().splitlines()) == 1   # what could be generated was


def test_ctrl_c_keeps_the_lines_and_says_how_to_resume(pair, tmp_path, monkeypatch):
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": i, "prompt": "a"}) + "\n" for i in range(3)))

    def interrupted(self, requests, batch_size, source_of):
        self._write(requests[0], [1], "x", "length", {"rounds": 1, "proposed": 0, "accepted": 0,
                                                      "acceptance_rate": None}, 0.1, batch_size)
        raise KeyboardInterrupt

    monkeypatch.setattr(generate_run.Runner, "run_stream", interrupted)
    out = tmp_path / "out.jsonl"
    result = split_runner().invoke(generate, _models(pair) + ["--input", str(source), "--output", str(out),
                                                              "--no-progress"])
    assert result.exit_code == 130
    assert "re-run the same command to resume" in result.stderr and "Aborted" not in result.stderr
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == [0]
