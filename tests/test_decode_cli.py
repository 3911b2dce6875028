"""`specsample decode` and `specsample bench decode` on the tiny pair, on the CPU."""
import json
import statistics

import pytest

pytest.importorskip("onnxruntime")

from click.testing import CliRunner  # noqa: E402

from models.build_tiny import build_tiny_pair  # noqa: E402
from specsample_cupy.cli.decode import decode  # noqa: E402
from specsample_cupy.decode.decoder import SpeculativeDecoder  # noqa: E402


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_tiny_pair(str(tmp_path_factory.mktemp("tiny")), vocab_size=48, seed=4)


def _runner():
    """A runner that keeps stderr apart from stdout (click 8.1 needs asking; 8.2 always does)."""
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:
        return CliRunner()


def _models(pair):
    return ["--target", pair[0], "--draft", pair[1], "--device", "cpu"]


def test_decode_streams_one_prompt_and_prints_stats_on_stderr(pair):
    args = _models(pair) + ["--prompt", "the sea", "--max-new-tokens", "20", "--gamma", "3", "--seed", "5"]
    result = _runner().invoke(decode, args)
    assert result.exit_code == 0, result.output
    expected = SpeculativeDecoder(*pair, device="cpu").generate("the sea", max_new_tokens=20, gamma=3, seed=5)
    assert result.stdout == expected.texts[0] + "\n"          # the generated text and nothing else
    for key in ("acceptance_rate", "tokens_per_s", "verify_time_per_round_s", "host_overhead_per_round_s"):
        assert key in result.stderr
    echoed = _runner().invoke(decode, args + ["--echo", "--no-stats"])
    assert echoed.stdout == "the sea" + expected.texts[0] + "\n" and echoed.stderr == ""


def test_decode_json_for_a_batch(pair):
    args = ["--prompt", "a", "--prompt", "hello there", "--max-new-tokens", "12", "--method", "greedy",
            "--adaptive-gamma", "--json"]
    result = CliRunner().invoke(decode, _models(pair) + args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert len(report["texts"]) == len(report["token_ids"]) == 2
    expected_decoder = SpeculativeDecoder(*pair, device="cpu")
    expected = expected_decoder.generate(["a", "hello there"], max_new_tokens=12, method="target", temperature=0)
    assert report["token_ids"] == expected.token_ids
    assert report["stats"]["method"] == "greedy" and report["stats"]["rounds"] > 0
    eos = expected_decoder.target_spec.eos_token_ids
    assert report["finish_reasons"] == ["eos" if ids[-1] in eos else "length" for ids in expected.token_ids]


def test_decode_reports_errors_cleanly(pair):
    result = _runner().invoke(decode, _models(pair) + ["--prompt", "x" * 300])
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.startswith("Error: --prompt 0: the prompt has 300 tokens") and "context" in result.stderr


def test_bench_decode_table_and_json(pair, tmp_path):
    from specsample_cupy.bench.decode import bench_decode

    path = tmp_path / "bench.json"
    args = ["--max-new-tokens", "10", "--methods", "exact,greedy", "--gamma", "3", "--batch", "3", "--seeds", "2",
            "--json", str(path), "--plot", str(tmp_path / "bench.png")]
    result = CliRunner().invoke(bench_decode, _models(pair) + args)
    assert result.exit_code == 0, result.output
    from PIL import Image
    with Image.open(tmp_path / "bench.png") as im:   # the plot, in a small palette
        assert im.mode == "P" and im.size[0] > 300
    rows = json.loads(path.read_text())["runs"][0]["rows"]
    assert [(r["method"], r["gamma"]) for r in rows] == [("target", 0), ("exact", 3), ("greedy", 3)]
    drift = rows[0]["drift"]   # target-only measured again at the end, against the first
    assert 0 < drift["min"] <= drift["median"] <= drift["max"] and "target-only again" in result.stdout
    # Speed-ups are target-only's wall over the method's, seed by seed, in the same run (the file keeps 4
    # significant digits).
    target_wall = {r["seed"]: r["wall_s"] for r in rows[0]["runs"]}
    for row in rows:
        assert [r["seed"] for r in row["runs"]] == [0, 1] and all(r["wall_s"] > 0 for r in row["runs"])
        ratios = [target_wall[r["seed"]] / r["wall_s"] for r in row["runs"]]
        assert row["speedup"]["median"] == pytest.approx(statistics.median(ratios), rel=2e-3)
        assert row["speedup"]["min"] == pytest.approx(min(ratios), rel=2e-3)
        assert row["method"] in result.stdout


def test_bench_decode_batches_share_one_prompt_set():
    """B = 1 runs one prompt per seed, and over four seeds exactly the prompts B = 4 decodes together."""
    from specsample_cupy.bench.decode import prompt_set, prompts_for

    prompts = prompt_set([1, 4])
    assert len(prompts) == 4 and len(set(prompts)) == 4
    singles = [prompts_for(prompts, 1, seed) for seed in range(5)]
    assert sorted(p for s in singles[:4] for p in s) == sorted(prompts) and singles[4] == singles[0]
    assert all(prompts_for(prompts, 4, seed) == prompts for seed in range(3))
    assert prompts_for(prompt_set([3, 5]), 3, 1) == [prompt_set([5])[i % 5] for i in (3, 4, 5)]
