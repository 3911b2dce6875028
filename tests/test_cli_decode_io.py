"""`specsample decode` input and output: prompts from stdin and files, JSON lines as requests finish,
finish reasons, warnings on stderr, and nothing on stdout when a run fails."""
import json

import pytest

pytest.importorskip("onnxruntime")


from models.build_tiny import build_tiny_pair  # noqa: E402
from specsample_cupy.cli.decode import decode  # noqa: E402
from specsample_cupy.decode.decoder import SpeculativeDecoder  # noqa: E402


from helpers_cli import split_runner as _runner  # noqa: E402


def _invoke(pair, args, **kwargs):
    return _runner().invoke(decode, ["--target", pair[0], "--draft", pair[1], "--device", "cpu"] + args, **kwargs)


@pytest.fixture(scope="module")
def reference(pair):
    return SpeculativeDecoder(*pair, device="cpu")


def _greedy(decoder, prompts, n=8):
    return decoder.generate(prompts, max_new_tokens=n, method="target", temperature=0)


GREEDY = ["--method", "greedy", "--max-new-tokens", "8"]


def test_prompt_from_stdin_is_read_verbatim(pair, reference):
    result = _invoke(pair, GREEDY + ["--prompt", "-", "--no-stats"], input="the sea\n")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == _greedy(reference, ["the sea\n"]).texts[0] + "\n"


def test_prompt_file_one_per_line(pair, reference, tmp_path):
    f = tmp_path / "prompts.txt"
    f.write_text("the sea\n\n   \nhello there\n")
    result = _invoke(pair, GREEDY + ["--prompt", "a", "--prompt-file", str(f), "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["token_ids"] == _greedy(reference, ["a", "the sea", "hello there"]).token_ids


def test_prompt_file_jsonl_detected_or_named(pair, reference, tmp_path):
    lines = [json.dumps({"prompt": "the sea", "id": 7}), json.dumps({"prompt": "hello\nthere"})]
    expected = _greedy(reference, ["the sea", "hello\nthere"]).token_ids
    for name in ("prompts.txt", "prompts.jsonl"):
        f = tmp_path / name
        f.write_text("\n".join(lines) + "\n\n")
        result = _invoke(pair, GREEDY + ["--prompt-file", str(f), "--json"])
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["token_ids"] == expected
    stdin = _invoke(pair, GREEDY + ["--prompt-file", "-", "--json"], input="\n".join(lines))
    assert json.loads(stdin.stdout)["token_ids"] == expected


def test_text_file_with_a_json_line_is_read_as_text_with_a_warning(pair, reference, tmp_path):
    f = tmp_path / "prompts.txt"
    f.write_text('the sea\n{"prompt": "x"}\n')
    result = _invoke(pair, GREEDY + ["--prompt-file", str(f), "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["token_ids"] == _greedy(reference, ["the sea", '{"prompt": "x"}']).token_ids
    assert "line(s) 2 are JSON objects" in result.stderr


def test_bad_jsonl_lines_are_reported_per_line(pair, tmp_path):
    f = tmp_path / "prompts.jsonl"
    f.write_text("\n".join([json.dumps({"prompt": "ok"}), "{oops", json.dumps({"text": "x"}),
                            json.dumps({"prompt": 3}), "[1]"]) + "\n")
    result = _invoke(pair, ["--prompt-file", str(f)])
    assert result.exit_code == 1 and result.stdout == ""
    assert f"Error: {f}: 4 bad line(s):" in result.stderr
    for n, why in ((2, "not a JSON object"), (3, 'no string "prompt" field'), (4, 'no string "prompt" field'),
                   (5, "not a JSON object")):
        assert f"  {f}:{n}: {why}" in result.stderr


@pytest.mark.parametrize("content,message", [(b"\n\n", "holds no prompts"), (b"\xff\xfe\x00x", "not UTF-8 text")])
def test_unusable_prompt_files(pair, tmp_path, content, message):
    f = tmp_path / "p.txt"
    f.write_bytes(content)
    result = _invoke(pair, ["--prompt-file", str(f)])
    assert result.exit_code == 1 and result.stdout == "" and message in result.stderr


@pytest.mark.parametrize("args,message", [
    ([], "no prompt given"),
    (["--prompt", "-", "--prompt-file", "-"], "stdin can be read once"),
    (["--prompt", "a", "--json", "--jsonl"], "exclusive"),
    (["--prompt", "a", "--method", "sigmoid", "--temperature", "0"], "--temperature"),
])
def test_usage_errors_come_first_and_leave_stdout_empty(pair, args, message):
    result = _invoke(pair, args, input="")
    assert result.exit_code == 2 and result.stdout == "", result.stdout
    assert message in result.stderr


def test_each_prompt_is_checked_before_generating(pair, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("fine\n" + "x" * 300 + "\nalso fine\n" + "y" * 280 + "\n")
    result = _invoke(pair, ["--prompt", "ok", "--prompt-file", str(f)])
    assert result.exit_code == 1 and result.stdout == ""
    assert "2 prompt(s) cannot be decoded" in result.stderr
    assert f"{f}:2: the prompt has 300 tokens" in result.stderr and f"{f}:4: the prompt has 280" in result.stderr


def test_empty_prompt_without_a_start_token_is_an_error(pair, tmp_path):
    import shutil
    dirs = []
    for role, src in zip(("target", "draft"), pair):
        d = shutil.copytree(src, tmp_path / role)
        for name in ("config.json", "generation_config.json"):
            if (d / name).exists():
                config = json.loads((d / name).read_text())
                config.pop("bos_token_id", None), config.pop("eos_token_id", None)
                (d / name).write_text(json.dumps(config))
        dirs.append(str(d))
    result = _invoke(dirs, ["--prompt", ""])
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.startswith("Error: --prompt 0: ") and "Traceback" not in result.stderr


def test_batch_text_output_is_the_texts_under_headers(pair, reference, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("hello there\n")
    result = _invoke(pair, GREEDY + ["--prompt", "the sea", "--prompt-file", str(f)])
    assert result.exit_code == 0, result.stderr
    texts = _greedy(reference, ["the sea", "hello there"]).texts
    assert result.stdout == f"--- [0] ---\n{texts[0]}\n--- [1] {f}:1 ---\n{texts[1]}\n"
    assert "acceptance_rate" in result.stderr


def test_jsonl_lines_come_as_requests_finish(tmp_path):
    # 16 tokens: EOS (id 0) comes often, so requests finish at different steps. Target-only decoding adds
    # one token per request per step, so the finish order is by length, then by index.
    pair = build_tiny_pair(str(tmp_path), vocab_size=16, seed=1)
    prompts = ["hsao e tlr", "sh", "salei", "at", "odioua", "leucaisrnt"]
    expected = SpeculativeDecoder(*pair, device="cpu").generate(prompts, max_new_tokens=30, method="target",
                                                                temperature=0)
    args = ["--method", "target", "--temperature", "0", "--max-new-tokens", "30", "--jsonl", "--no-stats"]
    for p in prompts:
        args += ["--prompt", p]
    result = _invoke(pair, args)
    assert result.exit_code == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    order = sorted(range(len(prompts)), key=lambda b: (len(expected.token_ids[b]), b))
    assert [line["index"] for line in lines] == order != sorted(order)
    for line in lines:
        b = line["index"]
        assert line["source"] == f"--prompt {b}"
        assert line["token_ids"] == expected.token_ids[b] and line["text"] == expected.texts[b]
        assert line["finish_reason"] == ("eos" if expected.token_ids[b][-1] == 0 else "length")
    assert {line["finish_reason"] for line in lines} == {"eos", "length"}


def test_context_stop_is_a_finish_reason_and_a_warning(tmp_path):
    pair = build_tiny_pair(str(tmp_path), vocab_size=48, seed=3, n_positions=24)
    prompt = "the rain in spain"   # 17 tokens: 7 fit before the context ends
    expected = SpeculativeDecoder(*pair, device="cpu").generate([prompt], max_new_tokens=20, method="target",
                                                                temperature=0)
    assert len(expected.token_ids[0]) == 7 and 0 not in expected.token_ids[0]
    for mode in ("--json", "--jsonl"):
        result = _invoke(pair, ["--prompt", prompt, "--method", "greedy", "--max-new-tokens", "20", mode])
        assert result.exit_code == 0, result.stderr
        report = json.loads(result.stdout.splitlines()[0])
        assert report.get("finish_reasons", [report.get("finish_reason")]) == ["context"]
        assert ("warning: --prompt 0: stopped at the end of the models' context (24 tokens) after 7 of "
                "--max-new-tokens 20") in result.stderr
    fits = _invoke(pair, ["--prompt", prompt, "--method", "greedy", "--max-new-tokens", "5", "--json"])
    assert json.loads(fits.stdout)["finish_reasons"] == ["length"] and "warning" not in fits.stderr


def test_decoder_value_errors_become_click_errors(pair, monkeypatch):
    def refuse(self, *args, **kwargs):
        raise ValueError("a model of the pair cannot decode this batch")
    monkeypatch.setattr(SpeculativeDecoder, "generate", refuse)
    result = _invoke(pair, ["--prompt", "a"])
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == "Error: a model of the pair cannot decode this batch\n"
