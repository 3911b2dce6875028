"""`specsample generate --ray` on a local two-CPU Ray with the tiny pair: the same lines as the
single-process run (continuous batching: greedy and sampled; --static: greedy), every id once, resume
across the two paths, how the requests are shared out, and a worker that dies mid-run."""
import json
import os
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
ray = pytest.importorskip("ray")
pa = pytest.importorskip("pyarrow")

from helpers_cli import split_runner  # noqa: E402
from helpers_streams import failing_after_one  # noqa: E402
from specsample_cupy.batch import ray_driver as generate_ray  # noqa: E402
from specsample_cupy.batch.inputs import Request, Settings  # noqa: E402
from specsample_cupy.batch.outputs import ResultWriter  # noqa: E402
from specsample_cupy.batch.ray_worker import DecodeWorker, WorkerSetup, share_row  # noqa: E402
from specsample_cupy.batch.runner import DecodeOptions, batches  # noqa: E402
from specsample_cupy.cli.generate import generate  # noqa: E402

PROMPTS = ["the sea", "hello there", "a", "def f(x):", "rain", "so it goes"]
GREEDY = ["--method", "greedy", "--temperature", "0", "--max-new-tokens", "8", "--batch-size", "4"]
ON_RAY = ["--ray", "--workers", "2", "--gpus-per-worker", "0"]


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local Ray for the module: each run reuses it (and leaves it up) instead of starting its own."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, ignore_reinit_error=True)
    yield
    ray.shutdown()


def _run(pair, input_path, output_path, *args):
    return split_runner().invoke(generate, ["--target", pair[0], "--draft", pair[1], "--device", "cpu", "--input",
                                            str(input_path), "--output", str(output_path), "--no-progress", *args])


def _write_jsonl(path, objects):
    path.write_text("".join(json.dumps(o) + "\n" for o in objects))


def _requests(n):
    return [{"id": f"g{i}", "prompt": PROMPTS[i % 6] + " " * (i // 6)} for i in range(n)]


def _by_id(path) -> dict:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    ids = [line["id"] for line in lines]
    assert len(ids) == len(set(ids)), "an id was written twice"
    return {line["id"]: line for line in lines}


def _reports(stderr: str) -> list[str]:
    return sorted(line for line in stderr.splitlines() if line.endswith("; skipped"))


@pytest.mark.parametrize("batching", [[], ["--static"]], ids=["continuous", "static"])
def test_greedy_lines_equal_the_single_process_run(pair, tmp_path, batching):
    objects = _requests(10)
    objects.insert(3, {"id": 7, "prompt": "rain", "max_new_tokens": 5})        # a static batch of its own
    objects.insert(5, {"id": "long", "prompt": "x" * 300, "max_new_tokens": 3})  # too long for the context
    source = tmp_path / "in.jsonl"
    _write_jsonl(source, objects)
    with source.open("a") as f:
        f.write("{oops\n")
    # The workers batch as the single-process run does (batch_size per line: each of the two workers
    # has 6 requests, so 4 rows, as the single process).
    alone = _run(pair, source, tmp_path / "alone.jsonl", *GREEDY, *batching)
    pooled = _run(pair, source, tmp_path / "pooled.jsonl", *GREEDY, *ON_RAY, *batching)
    assert alone.exit_code == 0, alone.stderr
    assert pooled.exit_code == 0, pooled.stderr
    expected, got = _by_id(tmp_path / "alone.jsonl"), _by_id(tmp_path / "pooled.jsonl")
    assert sorted(got, key=str) == sorted(expected, key=str) and len(got) == 11
    for key, line in expected.items():
        same = ("text", "token_ids", "finish_reason", "batch_size", "rounds", "proposed", "accepted", "line")
        assert {f: got[key][f] for f in same} == {f: line[f] for f in same}, key
    assert _reports(pooled.stderr) == _reports(alone.stderr) and len(_reports(alone.stderr)) == 2
    assert "11 written, 0 skipped as already done, 2 line(s) rejected, 0 failed" in pooled.stderr
    assert "on 2 Ray worker(s)" in pooled.stderr


def test_sampled_lines_follow_each_request_not_its_worker(pair, tmp_path):
    """Continuous batching draws each request's random numbers from its own seed, so its tokens do not
    depend on the worker, the share or the rows around it: the single-process run's, token for token."""
    objects = [dict(o, seed=i % 3, max_new_tokens=4 + i % 5) for i, o in enumerate(_requests(14))]
    objects[2]["temperature"] = 0.5
    source = tmp_path / "in.jsonl"
    _write_jsonl(source, objects)
    sampled = ["--method", "exact", "--temperature", "0.9", "--gamma", "3", "--batch-size", "3"]
    alone = _run(pair, source, tmp_path / "alone.jsonl", *sampled)
    pooled = _run(pair, source, tmp_path / "pooled.jsonl", *sampled, *ON_RAY)
    assert alone.exit_code == 0, alone.stderr
    assert pooled.exit_code == 0, pooled.stderr
    expected, got = _by_id(tmp_path / "alone.jsonl"), _by_id(tmp_path / "pooled.jsonl")
    assert sorted(got) == sorted(expected) and len(got) == 14
    for key, line in expected.items():
        same = ("text", "token_ids", "finish_reason", "rounds", "proposed", "accepted", "temperature", "seed")
        assert {f: got[key][f] for f in same} == {f: line[f] for f in same}, key


def test_shares_are_near_equal_in_input_order_and_a_multiple_of_the_workers():
    def sizes(n, batch_size, workers):
        parts = generate_ray.shares(list(range(n)), batch_size, workers)
        assert [i for p in parts for i in p] == list(range(n))
        return [len(p) for p in parts]

    assert sizes(192, 16, 1) == sizes(192, 16, 2) == [96, 96]   # at least SHARE_MIN_BATCHES batches' worth
    assert sizes(200, 16, 2) == [50] * 4                         # 3 would leave one worker a share behind
    assert sizes(12, 4, 2) == [6, 6] and sizes(5, 8, 2) == [2, 3] and sizes(1, 8, 4) == [1]
    assert sizes(2000, 8, 2) == [500] * 4                        # SHARES_PER_WORKER
    many = sizes(100_000, 8, 4)                                  # at most SHARE_MAX_BATCHES batches' worth
    assert len(many) == 196 and set(many) == {510, 511}


def test_resume_works_across_the_two_paths(pair, tmp_path):
    objects, source, out = _requests(14), tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_jsonl(source, objects[:5])
    assert _run(pair, source, out, *GREEDY).exit_code == 0
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:4]) + lines[4][:20])   # a torn last line, as a kill leaves it
    _write_jsonl(source, objects[:11])
    pooled = _run(pair, source, out, *GREEDY, *ON_RAY)
    assert pooled.exit_code == 0, pooled.stderr
    assert "cut away a torn last line (20 bytes)" in pooled.stderr
    assert "7 written, 4 skipped as already done" in pooled.stderr
    _write_jsonl(source, objects)
    alone = _run(pair, source, out, *GREEDY)
    assert alone.exit_code == 0 and "3 written, 11 skipped as already done" in alone.stderr
    again = _run(pair, source, out, *GREEDY, *ON_RAY)
    assert again.exit_code == 0 and "0 written, 14 skipped as already done" in again.stderr
    assert sorted(_by_id(out)) == sorted(o["id"] for o in objects)


def _crashing_once(marker: str):
    """A worker whose process dies in the middle of a share, two of its requests finished (their lines
    not yet handed back), the first time in the run (the marker file says it did)."""
    class CrashingOnce(DecodeWorker):
        def __init__(self, setup):
            super().__init__(setup)
            keep = self.lines.write

            def write(line):
                keep(line)
                if len(self.lines.lines) == 2 and not os.path.exists(marker):
                    Path(marker).touch()
                    os._exit(1)
            self.lines.write = write
    return CrashingOnce


@pytest.mark.slow   # a worker restarted by Ray: 3-4 s each on 2 cores
@pytest.mark.parametrize("static", [False, True], ids=["continuous", "static"])
def test_a_worker_that_dies_mid_run_is_replaced_and_every_id_written_once(pair, tmp_path, static):
    settings = Settings(8, 0.0, 0)
    requests = [Request(o["id"], json.dumps(o["id"]), n, o["prompt"], settings)
                for n, o in enumerate(_requests(12), 1)]
    setup = WorkerSetup("in", pair[0], pair[1], "cpu", 1, 4, DecodeOptions("greedy", 5, False), 2, static)
    parts = list(batches(requests, 4)) if static else generate_ray.shares(requests, 2, 2)
    assert len(parts) == (3 if static else 2)
    marker = tmp_path / "crashed"
    blocks = generate_ray.decoded(parts, setup, 2, 0, worker=_crashing_once(str(marker)), restarts=2)
    writer, tally = ResultWriter(str(tmp_path / "out.jsonl")), generate_ray.Tally()
    try:
        generate_ray.write_outcomes(blocks, writer, tally, len(requests), progress=False)
    finally:
        writer.close()
    assert marker.exists(), "no worker died"
    assert sorted(_by_id(tmp_path / "out.jsonl")) == sorted(r.id for r in requests)
    assert (tally.written, tally.failed, tally.rejected) == (12, 0, 0)


def test_an_answer_that_comes_twice_is_written_once(tmp_path):
    def block(*keys):
        return pa.Table.from_pylist([{"key": k, "outcome": "written", "report": "",
                                      "result": json.dumps({"id": json.loads(k), "new_tokens": 2, "proposed": 3,
                                                            "accepted": 1})} for k in keys])
    writer, tally = ResultWriter(str(tmp_path / "out.jsonl")), generate_ray.Tally()
    try:   # the batch of ids 1 and 2 ran twice: its worker died after answering, before Ray saw it finish
        generate_ray.write_outcomes([block("1", "2"), block('"x"'), block("1", "2")], writer, tally, 3, False)
    finally:
        writer.close()
    assert sorted(_by_id(tmp_path / "out.jsonl"), key=str) == [1, 2, "x"]
    assert (tally.written, tally.tokens, tally.proposed, tally.accepted) == (3, 6, 9, 3)


@pytest.mark.parametrize("static", [False, True], ids=["continuous", "static"])
def test_the_worker_reports_refused_requests_and_long_prompts_per_request(pair, monkeypatch, static):
    from specsample_cupy.decode.decoder import SpeculativeDecoder

    setup = WorkerSetup("in.jsonl", pair[0], pair[1], "cpu", 1, 4, DecodeOptions("exact", 5, False), 4, static)
    worker = DecodeWorker(setup)
    wide = Settings(4, 1.0, 2 ** 70)   # a seed wider than int64 still crosses as a row
    batch = [Request(1, "1", 1, "the sea", wide), Request("b", '"b"', 2, "x" * 300, wide)]
    rows = pa.Table.from_pylist([share_row(batch)])

    def refuse(self, *args, **kwargs):
        raise ValueError("a model of the pair cannot decode this batch")
    monkeypatch.setattr(SpeculativeDecoder, "generate", refuse)
    monkeypatch.setattr(SpeculativeDecoder, "generate_stream", refuse)
    outcomes = worker(rows).to_pylist()
    assert [(o["key"], o["outcome"], o["result"]) for o in outcomes] == [('"b"', "rejected", ""), ("1", "failed", "")]
    assert outcomes[0]["report"].startswith("in.jsonl:2: the prompt has 300 tokens") and \
        outcomes[0]["report"].endswith("; skipped")
    assert outcomes[1]["report"] == "in.jsonl:1: not generated: a model of the pair cannot decode this batch"


def test_a_stream_refused_midway_keeps_the_lines_it_finished(pair, monkeypatch):
    from specsample_cupy.decode.decoder import SpeculativeDecoder

    real = SpeculativeDecoder.generate_stream

    monkeypatch.setattr(SpeculativeDecoder, "generate_stream", failing_after_one(real, "target logits hold NaN/+Inf"))
    worker = DecodeWorker(WorkerSetup("in", pair[0], pair[1], "cpu", 1, 4, DecodeOptions("greedy", 3, False), 2))
    settings = [Settings(2, 0.0, 0), Settings(6, 0.0, 0), Settings(6, 0.0, 0)]   # the first finishes first
    outcomes = worker.decode_stream([Request(i, str(i), i + 1, PROMPTS[i], s) for i, s in enumerate(settings)])
    assert [(o["key"], o["outcome"]) for o in outcomes] == [("0", "written"), ("1", "failed"), ("2", "failed")]
    assert json.loads(outcomes[0]["result"])["new_tokens"] == 2
    assert outcomes[2]["report"] == "in:3: not generated: target logits hold NaN/+Inf"


def test_ray_options_need_ray_and_matching_devices(pair, tmp_path):
    (tmp_path / "p.txt").write_text("the sea\n")
    alone = _run(pair, tmp_path / "p.txt", tmp_path / "out.jsonl", "--workers", "2")
    assert alone.exit_code == 2 and "--workers only work with --ray" in alone.stderr
    cpu = _run(pair, tmp_path / "p.txt", tmp_path / "out.jsonl", "--ray", "--gpus-per-worker", "1")
    assert cpu.exit_code == 2 and "CPU workers take no GPU" in cpu.stderr
