"""`specsample eval asr|summarize --draft ngram`: prompt-lookup drafts instead of a draft model (CPU)."""
import json

import pytest
from click.testing import CliRunner

pytest.importorskip("onnxruntime")

from specsample_cupy.cli.eval import eval_group  # noqa: E402
from test_tasks_cli import _asr_manifest, _check_report, _invoke, text_pair, whisper_pair  # noqa: E402,F401


def _summary_data(tmp_path):
    data = tmp_path / "articles.jsonl"
    data.write_text("\n".join([
        json.dumps({"article": "The cat sat on the mat. The cat sat on the mat again.", "summary": "A cat sat."}),
        json.dumps({"article": "No reference for this one, so the target's output is used."}),
    ]) + "\n")
    return data


def _check_ngram_run(report, prediction_key, draft):
    """Greedy with lookup drafts gives target-only greedy's tokens, and the drafts were really used."""
    assert report["draft"] == draft
    greedy, target = report["items"]["greedy"], report["items"]["target"]
    assert [i["token_ids"] for i in greedy] == [i["token_ids"] for i in target]
    assert [i[prediction_key] for i in greedy] == [i[prediction_key] for i in target]
    proposed = sum(sum(i["draft_lengths"]) for i in greedy)
    accepted = sum(sum(i["accepted_per_round"]) for i in greedy)
    assert proposed > 0 and accepted > 0, "prompt lookup proposed or accepted nothing: the test shows nothing"
    summary = report["summary"]["greedy"]
    assert summary["acceptance_rate"] == pytest.approx(accepted / proposed)
    # One verification per round, rounds without a match included (a target step through verify()).
    assert summary["verify_steps"] == summary["rounds"] == sum(len(i["accepted_per_round"]) for i in greedy)


def test_eval_summarize_ngram(text_pair, tmp_path):  # noqa: F811
    pytest.importorskip("rouge_score")
    methods = ["greedy", "target"]
    out = _invoke(["summarize", "--target", text_pair[0], "--draft", "ngram", "--data", str(_summary_data(tmp_path)),
                   "--methods", ",".join(methods), "--temperature", "0", "--max-new-tokens", "24",
                   "--device", "cpu", "--json", str(tmp_path / "sum.json"), "--no-progress"])
    assert "ROUGE-1" in out and "greedy" in out
    report = json.loads((tmp_path / "sum.json").read_text())
    _check_report(report, methods, ["rouge1", "rouge2", "rougeL"])
    _check_ngram_run(report, "prediction", "ngram 1..4")


def test_eval_asr_ngram_default_methods(whisper_pair, tmp_path):  # noqa: F811
    pytest.importorskip("jiwer")
    out = _invoke(["asr", "--target", whisper_pair[0], "--draft", "ngram", "--ngram-min", "2", "--ngram-max", "3",
                   "--data", str(_asr_manifest(tmp_path)), "--temperature", "0", "--max-new-tokens", "24",
                   "--device", "cpu", "--json", str(tmp_path / "asr.json"), "--no-progress"])
    assert "WER" in out and "skipped 3 item(s)" in out
    report = json.loads((tmp_path / "asr.json").read_text())
    assert report["methods"] == ["exact", "greedy", "target"]   # the default with --draft ngram
    _check_report(report, report["methods"], ["wer"])
    _check_ngram_run(report, "hypothesis", "ngram 2..3")


def test_whisper_ngram_decoder_loads_no_draft_model(whisper_pair):  # noqa: F811
    from specsample_cupy.tasks.asr import WhisperSpeculativeDecoder

    dec = WhisperSpeculativeDecoder(whisper_pair[0], "ngram", "cpu", ngram_min=2, ngram_max=5)
    assert dec.draft is None and dec.draft_model is None and dec.ngram == (2, 5)
    with pytest.raises(ValueError, match="ngram_min"):
        WhisperSpeculativeDecoder(whisper_pair[0], "ngram", "cpu", ngram_min=3, ngram_max=2)


@pytest.mark.parametrize("task", ["summarize", "asr"])
def test_ngram_refuses_methods_that_need_draft_logits(tmp_path, task):
    # Refused before any model or data is read: the target and data here are no model and no data.
    args = [task, "--target", str(tmp_path), "--draft", "ngram", "--data", str(tmp_path / "d.jsonl")]
    (tmp_path / "d.jsonl").write_text("")
    r = CliRunner().invoke(eval_group, args + ["--methods", "exact,sigmoid,baseline,target"])
    assert r.exit_code == 2, r.output
    assert "sigmoid, baseline need a draft model" in r.output and "exact, greedy, target" in r.output
    r = CliRunner().invoke(eval_group, args)   # the default methods of a draft model would be refused
    assert "need a draft model" not in r.output


@pytest.mark.parametrize("task", ["summarize", "asr"])
@pytest.mark.parametrize("bounds, message", [(["--ngram-min", "3", "--ngram-max", "2"], "ngram_min"),
                                             (["--ngram-min", "0"], "--ngram-min"),
                                             (["--ngram-max", "0"], "--ngram-max")])
def test_bad_ngram_range_is_refused(tmp_path, task, bounds, message):
    (tmp_path / "d.jsonl").write_text("")
    r = CliRunner().invoke(eval_group, [task, "--target", str(tmp_path), "--draft", "ngram",
                                        "--data", str(tmp_path / "d.jsonl"), *bounds])
    assert r.exit_code == 2 and message in r.output, r.output
