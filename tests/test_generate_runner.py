"""`specsample generate` on the tiny pair, on the CPU: JSONL and text input, one valid line per request,
resume (after a clean run, a torn last line, and a real kill -9), bad lines reported and skipped,
continuous batching (each line what its request gets alone) and static batching by settings, and the
same tokens as `specsample decode` and the decoder."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from helpers_cli import split_runner  # noqa: E402
from helpers_streams import failing_after_one  # noqa: E402
from specsample_cupy.batch.inputs import Request, Settings  # noqa: E402
from specsample_cupy.batch.runner import batches  # noqa: E402
from specsample_cupy.cli.decode import decode  # noqa: E402
from specsample_cupy.cli.generate import generate  # noqa: E402
from specsample_cupy.decode.decoder import SpeculativeDecoder  # noqa: E402
from specsample_cupy.verification.seeds import key_of_id, request_seed  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["the sea", "hello there", "a", "def f(x):", "rain", "so it goes"]
LINE_FIELDS = {"id", "line", "text", "token_ids", "finish_reason", "new_tokens", "rounds", "proposed", "accepted",
               "acceptance_rate", "latency_s", "batch_size", "max_new_tokens", "temperature", "seed", "seed_from",
               "settings"}


def _models(pair):
    return ["--target", pair[0], "--draft", pair[1], "--device", "cpu"]


def _run(pair, input_path, output_path, *args):
    return split_runner().invoke(generate, _models(pair) + ["--input", str(input_path), "--output", str(output_path),
                                                            "--no-progress", *args])


def _write_jsonl(path, objects):
    path.write_text("".join(json.dumps(o) + "\n" for o in objects))


def _lines(path) -> list[dict]:
    """Every line of an output file, each of which must be a complete JSON object with every field."""
    data = path.read_text()
    assert data.endswith("\n")
    lines = [json.loads(line) for line in data.splitlines()]
    for line in lines:
        assert set(line) == LINE_FIELDS
    return lines


def _by_id(lines) -> dict:
    ids = [line["id"] for line in lines]
    assert len(ids) == len(set(ids)), "an id was written twice"
    return {line["id"]: line for line in lines}


@pytest.fixture(scope="module")
def reference(pair):
    return SpeculativeDecoder(*pair, device="cpu")


def test_batches_group_only_equal_settings():
    a, b = Settings(8, 1.0, 0), Settings(4, 1.0, 0)
    requests = [Request(i, str(i), i, "p", s) for i, s in enumerate([a, b, a, a, b, a, a])]
    groups = [[r.id for r in batch] for batch in batches(requests, 3)]
    assert groups == [[0, 2, 3], [1, 4], [5, 6]]   # full batches at once, then the partial ones by first request
    assert all(len({requests[i].settings for i in g}) == 1 for g in groups)


def test_jsonl_input_matches_the_decoder_batch_by_batch(pair, reference, tmp_path):
    objects = [{"id": f"r{i}", "prompt": p} for i, p in enumerate(PROMPTS[:4])]
    objects.insert(2, {"id": 99, "prompt": "the sea", "max_new_tokens": 5, "temperature": 0.5, "seed": 7})
    _write_jsonl(tmp_path / "in.jsonl", objects)
    result = _run(pair, tmp_path / "in.jsonl", tmp_path / "out.jsonl", "--max-new-tokens", "10", "--gamma", "3",
                  "--seed", "11", "--batch-size", "4", "--static")
    assert result.exit_code == 0, result.stderr
    lines = _by_id(_lines(tmp_path / "out.jsonl"))
    assert set(lines) == {"r0", "r1", "r2", "r3", 99}
    # The four requests of the default settings are one generate() call, each with the seed derived from
    # --seed and its id; the overriding line its own call, with its own seed.
    seeds = [lines[f"r{i}"]["seed"] for i in range(4)]
    assert seeds == [request_seed(11, key_of_id(f"r{i}")) for i in range(4)]
    assert {lines[f"r{i}"]["seed_from"] for i in range(4)} == {"run"} and lines[99]["seed_from"] == "line"
    main = reference.generate(PROMPTS[:4], max_new_tokens=10, gamma=3, seeds=seeds)
    for i in range(4):
        line = lines[f"r{i}"]
        assert line["token_ids"] == main.token_ids[i] and line["text"] == main.texts[i]
        assert line["finish_reason"] == main.finish_reasons[i] and line["batch_size"] == 4
        assert line["new_tokens"] == len(line["token_ids"]) and line["latency_s"] > 0
    assert sum(lines[f"r{i}"]["accepted"] for i in range(4)) == main.stats["accepted"]
    assert sum(lines[f"r{i}"]["proposed"] for i in range(4)) == main.stats["proposed"]
    alone = reference.generate(["the sea"], max_new_tokens=5, gamma=3, temperature=0.5, seed=7)
    assert lines[99]["token_ids"] == alone.token_ids[0] and lines[99]["batch_size"] == 1
    assert (lines[99]["max_new_tokens"], lines[99]["temperature"], lines[99]["seed"]) == (5, 0.5, 7)
    assert "5 written, 0 skipped as already done, 0 line(s) rejected" in result.stderr
    assert "outside generate() calls" in result.stderr


def test_jsonl_input_batched_continuously_matches_each_request_alone(pair, reference, tmp_path):
    """The default, continuous batching: requests of any settings share the rows, and every line holds
    what generate() gives its request alone, sampled with the request's own seed."""
    objects = [{"id": f"r{i}", "prompt": p, "max_new_tokens": 4 + 3 * i} for i, p in enumerate(PROMPTS)]
    objects.insert(2, {"id": 99, "prompt": "the sea", "max_new_tokens": 5, "temperature": 0.5, "seed": 7})
    _write_jsonl(tmp_path / "in.jsonl", objects)
    result = _run(pair, tmp_path / "in.jsonl", tmp_path / "out.jsonl", "--max-new-tokens", "10", "--gamma", "3",
                  "--seed", "11", "--temperature", "0.8", "--batch-size", "3")
    assert result.exit_code == 0, result.stderr
    lines = _by_id(_lines(tmp_path / "out.jsonl"))
    assert set(lines) == {o["id"] for o in objects}
    for o in objects:
        line = lines[o["id"]]
        assert line["seed"] == o.get("seed", request_seed(11, key_of_id(o["id"])))
        alone = reference.generate([o["prompt"]], max_new_tokens=o["max_new_tokens"], gamma=3,
                                   temperature=o.get("temperature", 0.8), seed=line["seed"])
        assert (line["token_ids"], line["text"], line["finish_reason"]) == \
            (alone.token_ids[0], alone.texts[0], alone.finish_reasons[0])
        assert (line["proposed"], line["accepted"]) == (alone.stats["proposed"], alone.stats["accepted"])
        assert line["batch_size"] == 3 and line["latency_s"] > 0 and line["max_new_tokens"] == o["max_new_tokens"]
    assert "7 written, 0 skipped as already done, 0 line(s) rejected" in result.stderr
    assert "batching statically" not in result.stderr


@pytest.mark.parametrize("static", [False, True], ids=["continuous", "static"])
def test_logprobs_lines_carry_one_per_token(pair, reference, tmp_path, static):
    """--logprobs: every line also holds "logprobs", one float per token, those the decoder gives
    (its request alone, or its generate() call with --static); the tokens are those of a run without
    --logprobs, and --top-k / --min-p reach the decoder."""
    objects = [{"id": f"r{i}", "prompt": p} for i, p in enumerate(PROMPTS)]
    objects.append({"id": 99, "prompt": "the sea", "max_new_tokens": 0})
    _write_jsonl(tmp_path / "in.jsonl", objects)
    kw = dict(max_new_tokens=8, gamma=3, temperature=0.8, seed=5, top_k=20, min_p=0.05)
    args = ["--max-new-tokens", "8", "--gamma", "3", "--temperature", "0.8", "--seed", "5", "--top-k", "20",
            "--min-p", "0.05", "--batch-size", "3"] + (["--static"] if static else [])
    result = _run(pair, tmp_path / "in.jsonl", tmp_path / "out.jsonl", *args, "--logprobs")
    assert result.exit_code == 0, result.stderr
    lines = _by_id([json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()])
    plain = _run(pair, tmp_path / "in.jsonl", tmp_path / "plain.jsonl", *args)
    assert plain.exit_code == 0, plain.stderr
    plain = _by_id(_lines(tmp_path / "plain.jsonl"))   # no "logprobs" field without the option
    assert set(lines) == set(plain) == {o["id"] for o in objects}
    assert lines[99]["token_ids"] == lines[99]["logprobs"] == []
    kw.pop("seed")   # each request's seed is on its line
    seeds = [lines[f"r{i}"]["seed"] for i in range(len(PROMPTS))]
    calls = [reference.generate(PROMPTS[i:i + 3], logprobs=True, seeds=seeds[i:i + 3], **kw) for i in (0, 3)] \
        if static else None
    for i, p in enumerate(PROMPTS):
        line = lines[f"r{i}"]
        assert set(line) == LINE_FIELDS | {"logprobs"} and line["token_ids"] == plain[f"r{i}"]["token_ids"]
        out, b = (calls[i // 3], i % 3) if static else (reference.generate([p], logprobs=True, seed=seeds[i], **kw), 0)
        assert line["token_ids"] == out.token_ids[b] and len(line["logprobs"]) == len(line["token_ids"])
        np.testing.assert_allclose(line["logprobs"], out.logprobs[b], rtol=1e-5, atol=1e-5)
        assert line["latency_s"] > 0


def test_ray_workers_write_logprobs_too(pair, reference):
    """--ray hands the run's DecodeOptions to its workers, whose runner writes the same lines."""
    from specsample_cupy.batch.ray_worker import DecodeWorker, WorkerSetup
    from specsample_cupy.batch.runner import DecodeOptions
    options = DecodeOptions("exact", 3, False, (), {"top_k": 20}, logprobs=True)
    worker = DecodeWorker(WorkerSetup("in", pair[0], pair[1], "cpu", 1, 4, options))
    settings = Settings(6, 0.8, 4)
    outcomes = worker.decode([Request(i, str(i), i, p, settings) for i, p in enumerate(PROMPTS[:3])])
    out = reference.generate(PROMPTS[:3], max_new_tokens=6, gamma=3, temperature=0.8, seeds=[4] * 3, top_k=20,
                             logprobs=True)
    for o in outcomes:
        line = json.loads(o["result"])
        assert line["token_ids"] == out.token_ids[line["id"]]
        np.testing.assert_allclose(line["logprobs"], out.logprobs[line["id"]], rtol=1e-5, atol=1e-5)


def test_logprobs_need_a_method_that_gives_them(pair, tmp_path):
    _write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "prompt": "a"}])
    result = _run(pair, tmp_path / "in.jsonl", tmp_path / "out.jsonl", "--method", "sigmoid", "--logprobs")
    assert result.exit_code == 2 and "--logprobs" in result.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_text_input_ids_are_line_numbers_and_resume_skips_them(pair, tmp_path):
    source = tmp_path / "prompts.txt"
    source.write_text("the sea\n\nhello there\n")
    out = tmp_path / "out.jsonl"
    first = _run(pair, source, out, "--max-new-tokens", "6", "--gamma", "auto")
    assert first.exit_code == 0, first.stderr
    assert sorted(line["id"] for line in _lines(out)) == [1, 3]
    source.write_text("the sea\n\nhello there\na\nrain\n")   # two more prompts: only they run
    second = _run(pair, source, out, "--max-new-tokens", "6", "--gamma", "auto")
    assert second.exit_code == 0, second.stderr
    assert "2 written, 2 skipped as already done" in second.stderr
    lines = _by_id(_lines(out))
    assert sorted(lines) == [1, 3, 4, 5] and lines[4]["line"] == 4
    again = _run(pair, source, out, "--max-new-tokens", "6", "--gamma", "auto")
    assert again.exit_code == 0 and "0 written, 4 skipped as already done" in again.stderr
    assert len(_lines(out)) == 4


def test_a_torn_last_line_is_cut_away_and_its_request_runs_again(pair, tmp_path):
    _write_jsonl(tmp_path / "in.jsonl", [{"id": i, "prompt": p} for i, p in enumerate(PROMPTS[:3])])
    out = tmp_path / "out.jsonl"
    # Greedy: a request's tokens do not depend on its row in a batch, so the rerun must repeat them.
    greedy = ["--method", "greedy", "--temperature", "0", "--max-new-tokens", "6"]
    assert _run(pair, tmp_path / "in.jsonl", out, *greedy).exit_code == 0
    lines = _lines(out)
    kept, torn = lines[:2], json.dumps(lines[2])
    out.write_text("".join(json.dumps(line) + "\n" for line in kept) + torn[:len(torn) // 2])
    result = _run(pair, tmp_path / "in.jsonl", out, *greedy)
    assert result.exit_code == 0, result.stderr
    assert f"cut away a torn last line ({len(torn) // 2} bytes)" in result.stderr
    assert "1 written, 2 skipped as already done" in result.stderr
    repaired = _by_id(_lines(out))
    assert sorted(repaired) == [0, 1, 2] and repaired[lines[2]["id"]]["token_ids"] == lines[2]["token_ids"]


def test_kill_9_mid_run_then_resume_writes_every_id_once(pair, tmp_path):
    n = 24
    _write_jsonl(tmp_path / "in.jsonl", [{"id": f"k{i}", "prompt": PROMPTS[i % 6] + " " * (i // 6)} for i in range(n)])
    out = tmp_path / "out.jsonl"
    args = ["--input", str(tmp_path / "in.jsonl"), "--output", str(out), "--max-new-tokens", "12", "--no-progress"]
    process = subprocess.Popen([sys.executable, str(REPO / "cli.py"), "generate", *_models(pair), *args,
                                "--batch-size", "1"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (out.exists() and out.read_bytes().count(b"\n") >= 3):
            assert process.poll() is None, process.stderr.read().decode()
            assert time.monotonic() < deadline, "no output from the run"
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()
        process.stderr.close()
    assert process.returncode == -signal.SIGKILL
    interrupted = out.read_bytes().count(b"\n")
    assert 3 <= interrupted < n
    result = split_runner().invoke(generate, _models(pair) + args + ["--batch-size", "8"])
    assert result.exit_code == 0, result.stderr
    lines = _by_id(_lines(out))
    assert sorted(lines) == sorted(f"k{i}" for i in range(n))
    assert f"{n - interrupted} written, {interrupted} skipped as already done" in result.stderr


def test_bad_lines_are_reported_by_number_and_skipped(pair, tmp_path):
    source = tmp_path / "in.jsonl"
    rows = [json.dumps({"id": 1, "prompt": "the sea"}), "{oops", json.dumps({"prompt": "no id"}),
            json.dumps({"id": 1, "prompt": "again"}), json.dumps({"id": 2, "prompt": "x" * 300}),
            json.dumps({"id": 3, "prompt": "ok", "max_new_tokens": -1}), json.dumps({"id": [4], "prompt": "ok"}),
            json.dumps({"id": 5, "prompt": 5}), json.dumps({"id": 6, "prompt": "fine"})]
    source.write_bytes(("\n".join(rows) + "\n").encode() + b'{"id": 7, "prompt": "\xff"}\n')
    result = _run(pair, source, tmp_path / "out.jsonl", "--max-new-tokens", "4")
    assert result.exit_code == 0, result.stderr
    for n, why in ((2, "not a JSON object"), (3, 'no "id" field'), (4, "duplicate id 1 (first on line 1)"),
                   (5, "the prompt has 300 tokens"), (6, '"max_new_tokens" must be an integer >= 0'),
                   (7, '"id" must be a string or an integer'), (8, 'no string "prompt" field'), (10, "not UTF-8")):
        assert f"{source}:{n}: {why}" in result.stderr
    assert sorted(_by_id(_lines(tmp_path / "out.jsonl"))) == [1, 6]
    assert "2 written, 0 skipped as already done, 8 line(s) rejected" in result.stderr


def test_exit_status_is_an_error_only_when_nothing_can_run(pair, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text("{oops\n" + json.dumps({"id": 1, "prompt": "y" * 290}) + "\n")
    nothing = _run(pair, source, tmp_path / "out.jsonl")
    assert nothing.exit_code == 1 and "nothing was generated" in nothing.stderr
    source.write_text("{oops\n")
    assert _run(pair, source, tmp_path / "out.jsonl").exit_code == 1
    usage = _run(pair, source, tmp_path / "out.jsonl", "--gamma", "many")
    assert usage.exit_code == 2 and "'many' is neither" in usage.stderr
    same = _run(pair, source, source)
    assert same.exit_code == 2 and "must not be the --input" in same.stderr


def test_a_refused_batch_is_reported_per_request(pair, tmp_path, monkeypatch):
    def refuse(self, *args, **kwargs):
        raise ValueError("a model of the pair cannot decode this batch")
    monkeypatch.setattr(SpeculativeDecoder, "generate", refuse)
    monkeypatch.setattr(SpeculativeDecoder, "generate_stream", refuse)
    (tmp_path / "p.txt").write_text("the sea\nrain\n")
    result = _run(pair, tmp_path / "p.txt", tmp_path / "out.jsonl")
    assert result.exit_code == 1 and "nothing was generated" in result.stderr
    for n in (1, 2):
        assert f"{tmp_path / 'p.txt'}:{n}: not generated: a model of the pair cannot decode this batch" in result.stderr
    assert "0 written, 0 skipped as already done, 0 line(s) rejected, 2 failed" in result.stderr


def test_a_stream_refused_midway_keeps_its_lines_and_reports_the_rest(pair, tmp_path, monkeypatch):
    real = SpeculativeDecoder.generate_stream

    monkeypatch.setattr(SpeculativeDecoder, "generate_stream", failing_after_one(real, "target logits hold NaN/+Inf"))
    (tmp_path / "p.txt").write_text("the sea\nrain\na\n")
    result = _run(pair, tmp_path / "p.txt", tmp_path / "out.jsonl", "--max-new-tokens", "4", "--batch-size", "2")
    assert result.exit_code == 0, result.stderr
    assert len(_lines(tmp_path / "out.jsonl")) == 1
    assert result.stderr.count("not generated: target logits hold NaN/+Inf") == 2
    assert "1 written, 0 skipped as already done, 0 line(s) rejected, 2 failed" in result.stderr


def test_options_continuous_batching_cannot_take_batch_statically_with_a_note(pair, tmp_path):
    (tmp_path / "p.txt").write_text("the sea\nrain\n")
    for args in (["--gamma", "auto"], ["--adaptive-gamma"], ["--method", "baseline"]):
        out = tmp_path / f"out{len(args)}{args[-1]}.jsonl"
        result = _run(pair, tmp_path / "p.txt", out, "--max-new-tokens", "4", *args)
        assert result.exit_code == 0, result.stderr
        assert "batching statically:" in result.stderr and len(_lines(out)) == 2


def test_greedy_lines_equal_specsample_decode(pair, tmp_path):
    prompts = PROMPTS[:4]
    (tmp_path / "p.txt").write_text("\n".join(prompts) + "\n")
    greedy = ["--method", "greedy", "--temperature", "0", "--max-new-tokens", "10"]
    result = split_runner().invoke(generate, _models(pair) + greedy + [
        "--input", str(tmp_path / "p.txt"), "--output", str(tmp_path / "out.jsonl"), "--batch-size", "4"])
    assert result.exit_code == 0, result.stderr
    assert "req" in result.stderr   # the progress bar
    decoded = split_runner().invoke(decode, _models(pair) + greedy + ["--prompt-file", str(tmp_path / "p.txt"),
                                                                      "--jsonl", "--no-stats"])
    assert decoded.exit_code == 0, decoded.stderr
    lines = _by_id(_lines(tmp_path / "out.jsonl"))
    for expected in map(json.loads, decoded.stdout.splitlines()):
        line = lines[expected["index"] + 1]   # text input: the id is the line number
        assert (line["text"], line["token_ids"], line["finish_reason"]) == \
            (expected["text"], expected["token_ids"], expected["finish_reason"])
    assert len(lines) == len(prompts) and os.path.getsize(tmp_path / "out.jsonl") > 0


def test_input_format_detection_and_line_numbers():
    from specsample_cupy.batch.inputs import read_requests

    defaults = Settings(8, 1.0, 0)
    mostly_json = b'{"id": "a", "prompt": "x"}\r\n\n{oops\n{"id": "b", "prompt": "y", "seed": 3}\n'
    requests, rejections, read_as = read_requests(mostly_json, "data.txt", "auto", defaults, "exact")
    assert read_as == "jsonl" and [(r.id, r.line, r.prompt) for r in requests] == [("a", 1, "x"), ("b", 4, "y")]
    assert requests[1].settings == Settings(8, 1.0, 3, "line") and [(r.line, r.reason) for r in rejections] == \
        [(3, "not a JSON object")]
    text = b'def f():\n{"id": 1, "prompt": "x"}\n\n  return 1\n'
    requests, rejections, read_as = read_requests(text, "data.txt", "auto", defaults, "exact")
    assert read_as == "text" and not rejections
    assert [(r.id, r.key, r.prompt) for r in requests] == [(1, "1", "def f():"), (2, "2", '{"id": 1, "prompt": "x"}'),
                                                           (4, "4", "  return 1")]
    sampling_only = b'{"id": 1, "prompt": "x", "temperature": 0}\n'
    _, rejections, _ = read_requests(sampling_only, "d.jsonl", "auto", defaults, "sigmoid")
    assert "does not work with method 'sigmoid'" in rejections[0].reason


def test_output_file_is_locked_and_bad_complete_lines_are_not_done(tmp_path):
    from specsample_cupy.batch.outputs import OutputBusy, ResultWriter

    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"id": 1}\nnot json\n{"id": "b"}\n{"id": 2, "te')
    writer = ResultWriter(str(path))
    try:
        assert writer.recovered.done == {"1", '"b"'} and writer.recovered.bad_lines == [2]
        assert writer.recovered.torn_bytes == len(b'{"id": 2, "te')
        with pytest.raises(OutputBusy):
            ResultWriter(str(path))
        writer.write({"id": 2})
    finally:
        writer.close()
    assert path.read_bytes() == b'{"id": 1}\nnot json\n{"id": "b"}\n{"id": 2}\n'


def test_stop_strings_cut_lines_as_decode_does(pair, tmp_path):
    """--stop: a request a stop string ends is written with the cut text and ids ("stop"), as
    `specsample decode --stop` prints it; the others are unaffected."""
    prompts = PROMPTS[:4]
    (tmp_path / "p.txt").write_text("\n".join(prompts) + "\n")
    greedy = ["--method", "greedy", "--temperature", "0", "--max-new-tokens", "24"]
    plain = split_runner().invoke(decode, _models(pair) + greedy + ["--prompt-file", str(tmp_path / "p.txt"),
                                                                    "--jsonl", "--no-stats"])
    texts = [json.loads(line)["text"] for line in plain.stdout.splitlines()]
    stop = next((t[4:7] for t in texts if len(t) > 8), None)
    if stop is None:
        pytest.skip("no text long enough")
    args = greedy + ["--stop", stop]
    result = split_runner().invoke(generate, _models(pair) + args + [
        "--input", str(tmp_path / "p.txt"), "--output", str(tmp_path / "out.jsonl"), "--batch-size", "4"])
    assert result.exit_code == 0, result.stderr
    decoded = split_runner().invoke(decode, _models(pair) + args + ["--prompt-file", str(tmp_path / "p.txt"),
                                                                    "--jsonl", "--no-stats"])
    lines = _by_id(_lines(tmp_path / "out.jsonl"))
    reasons = []
    for expected in map(json.loads, decoded.stdout.splitlines()):
        line = lines[expected["index"] + 1]
        assert (line["text"], line["token_ids"], line["finish_reason"]) == \
            (expected["text"], expected["token_ids"], expected["finish_reason"])
        assert stop not in line["text"] and line["new_tokens"] == len(line["token_ids"])
        reasons.append(line["finish_reason"])
    assert "stop" in reasons
