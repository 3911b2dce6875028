"""`specsample decode` and `specsample bench decode` on the tiny pair, on the CPU."""
import json

import pytest

pytest.importorskip("onnxruntime")

from click.testing import CliRunner  # noqa: E402

from models.build_tiny import build_tiny_pair  # noqa: E402
from specsample_cupy.bench_decode import BENCH_METHODS, bench_decode  # noqa: E402
from specsample_cupy.cli_decode import decode  # noqa: E402
from specsample_cupy.decoder import SpeculativeDecoder  # noqa: E402


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_tiny_pair(str(tmp_path_factory.mktemp("tiny")), vocab_size=48, seed=4)


def _models(pair):
    return ["--target", pair[0], "--draft", pair[1], "--device", "cpu"]


def test_decode_streams_one_prompt_and_prints_stats(pair):
    result = CliRunner().invoke(decode, _models(pair) + ["--prompt", "the sea", "--max-new-tokens", "20",
                                                         "--gamma", "3", "--seed", "5"])
    assert result.exit_code == 0, result.output
    expected = SpeculativeDecoder(*pair, device="cpu").generate("the sea", max_new_tokens=20, gamma=3, seed=5)
    assert result.stdout.startswith("the sea" + expected.texts[0] + "\n")
    for key in ("acceptance_rate", "tokens_per_s", "verify_time_per_round_s", "host_overhead_per_round_s"):
        assert key in result.stdout


def test_decode_json_for_a_batch(pair):
    args = ["--prompt", "a", "--prompt", "hello there", "--max-new-tokens", "12", "--method", "greedy",
            "--adaptive-gamma", "--json"]
    result = CliRunner().invoke(decode, _models(pair) + args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert len(report["texts"]) == len(report["token_ids"]) == 2
    expected = SpeculativeDecoder(*pair, device="cpu").generate(["a", "hello there"], max_new_tokens=12,
                                                                 method="target", temperature=0)
    assert report["token_ids"] == expected.token_ids
    assert report["stats"]["method"] == "greedy" and report["stats"]["rounds"] > 0


def test_decode_reports_errors_cleanly(pair):
    result = CliRunner().invoke(decode, _models(pair) + ["--prompt", "x" * 300])
    assert result.exit_code != 0
    assert "context" in result.output


def test_bench_decode_table_and_json(pair, tmp_path):
    path = tmp_path / "bench.json"
    result = CliRunner().invoke(bench_decode, _models(pair) + ["--max-new-tokens", "10", "--gamma", "3",
                                                               "--prompts", "3", "--json", str(path)])
    assert result.exit_code == 0, result.output
    report = json.loads(path.read_text())
    assert [r["method"] for r in report["results"]] == list(BENCH_METHODS)
    assert report["results"][0]["speedup"] == pytest.approx(1.0)
    for row in report["results"]:
        assert row["tokens_per_s"] > 0 and row["rounds"] > 0
        assert row["method"] in result.stdout
