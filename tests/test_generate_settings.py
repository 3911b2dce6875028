"""Runs that know their settings (specsample_cupy/batch/run_settings.py): every line of `specsample
generate` records them, a resume with other settings (method, temperature, model, ...) is refused in one
line before any model loads, --force-settings mixes them, and a resume with the same settings completes
the file with every id exactly once. CPU, the tiny pair of conftest.py."""
import json
import shutil

import pytest

pytest.importorskip("onnxruntime")

from helpers_cli import split_runner  # noqa: E402
from specsample_cupy.batch.run_settings import SEED_RULE, first_difference, model_fingerprint  # noqa: E402
from specsample_cupy.cli import generate as cli_generate  # noqa: E402
from specsample_cupy.cli.generate import generate  # noqa: E402

PROMPTS = ["the sea", "hello there", "a", "def f(x):", "rain", "so it goes"]
SETTINGS_KEYS = {"method", "gamma", "adaptive_gamma", "temperature", "max_new_tokens", "top_k", "top_p", "min_p",
                 "stop", "seed", "seed_rule", "seed_origin", "target", "target_fingerprint", "draft",
                 "draft_fingerprint"}


def _run(pair, source, out, *args):
    return split_runner().invoke(generate, ["--target", pair[0], "--draft", pair[1], "--device", "cpu", "--input",
                                            str(source), "--output", str(out), "--no-progress", *args])


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS[:3])))
    return path


def _grow(source, n=len(PROMPTS)):
    source.write_text("".join(json.dumps({"id": f"r{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS[:n])))


BASE = ["--max-new-tokens", "5", "--temperature", "0.8", "--top-k", "20", "--stop", "zz", "--seed", "3"]


def test_every_line_records_the_run_settings(pair, source, tmp_path):
    result = _run(pair, source, tmp_path / "out.jsonl", *BASE)
    assert result.exit_code == 0, result.stderr
    lines = _lines(tmp_path / "out.jsonl")
    settings = lines[0]["settings"]
    assert set(settings) == SETTINGS_KEYS and all(line["settings"] == settings for line in lines)
    assert (settings["method"], settings["gamma"], settings["temperature"], settings["top_k"], settings["stop"],
            settings["max_new_tokens"], settings["seed"], settings["seed_origin"], settings["seed_rule"]) == \
        ("exact", 5, 0.8, 20, ["zz"], 5, 3, "option", SEED_RULE)
    assert settings["target_fingerprint"] == model_fingerprint(pair[0]) != settings["draft_fingerprint"]
    assert all(line["seed_from"] == "run" for line in lines)


@pytest.mark.parametrize("change,difference", [
    (["--method", "greedy", "--temperature", "0"], "method: the file has \"exact\", this run \"greedy\""),
    (["--temperature", "1.2"], "temperature: the file has 0.8, this run 1.2"),
    (["--top-k", "5"], "top_k: the file has 20, this run 5"),
    (["--seed", "4"], "seed: the file has 3, this run 4"),
    (["--gamma", "auto"], "gamma: the file has 5, this run \"auto\""),
], ids=["method", "temperature", "top-k", "seed", "gamma"])
def test_a_resume_with_other_settings_is_refused_before_loading(pair, source, tmp_path, monkeypatch, change,
                                                                difference):
    out = tmp_path / "out.jsonl"
    assert _run(pair, source, out, *BASE).exit_code == 0
    before = out.read_bytes()
    _grow(source)
    monkeypatch.setattr(cli_generate, "load_decoder", lambda *a, **k: pytest.fail("loaded the models"))
    args = BASE + change   # click keeps an option's last value
    result = _run(pair, source, out, *args)
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        f"Error: {out}:1 was written with other settings ({difference}); use the same options to resume, another "
        "--output, or --force-settings to mix them"]
    assert out.read_bytes() == before


def test_a_resume_with_another_model_is_refused(pair, source, tmp_path):
    from models.build_tiny import build_tiny_pair
    other = build_tiny_pair(str(tmp_path / "other"), vocab_size=48, seed=4)
    out = tmp_path / "out.jsonl"
    assert _run(pair, source, out, *BASE).exit_code == 0
    _grow(source)
    result = _run(other, source, out, *BASE)
    assert result.exit_code == 1 and "target_fingerprint: the file has" in result.stderr
    # The same files in another folder are the same model: only the fingerprints are compared.
    moved = tmp_path / "moved"
    shutil.copytree(pair[0], moved / "target")
    shutil.copytree(pair[1], moved / "draft")
    result = _run((str(moved / "target"), str(moved / "draft")), source, out, *BASE)
    assert result.exit_code == 0, result.stderr


def test_same_settings_complete_the_file_and_forcing_mixes(pair, source, tmp_path):
    out = tmp_path / "out.jsonl"
    assert _run(pair, source, out, *BASE).exit_code == 0
    _grow(source, 5)
    resumed = _run(pair, source, out, *BASE)
    assert resumed.exit_code == 0, resumed.stderr
    assert "2 written, 3 skipped as already done" in resumed.stderr
    ids = [line["id"] for line in _lines(out)]
    assert sorted(ids) == [f"r{i}" for i in range(5)]
    _grow(source)
    forced = _run(pair, source, out, *BASE, "--temperature", "0.5", "--force-settings")
    assert forced.exit_code == 0, forced.stderr
    lines = _lines(out)
    assert sorted(line["id"] for line in lines) == [f"r{i}" for i in range(6)]   # every id exactly once
    assert [line["settings"]["temperature"] for line in lines] == [0.8] * 5 + [0.5]
    # Now mixed, the file refuses a plain resume under either of its settings.
    assert _run(pair, source, out, *BASE).exit_code == 1


def test_lines_without_settings_are_not_compared(pair, source, tmp_path):
    """A file written before settings were recorded resumes as before."""
    out = tmp_path / "out.jsonl"
    out.write_text(json.dumps({"id": "r0", "text": "", "token_ids": []}) + "\n")
    result = _run(pair, source, out, *BASE)
    assert result.exit_code == 0 and "2 written, 1 skipped as already done" in result.stderr


def test_fingerprints_follow_the_files_not_their_folder(pair, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(pair[0], copy)
    assert model_fingerprint(copy) == model_fingerprint(pair[0])
    config = copy / "config.json"
    config.write_text(config.read_text() + " ")
    assert model_fingerprint(copy) != model_fingerprint(pair[0])
    assert first_difference({"a": 1, "target": "x"}, {"a": 1, "target": "y"}) is None
    assert first_difference({"a": 1}, {"a": 1, "b": 2}) == 'b: the file has "nothing", this run 2'
