"""WER and ROUGE plumbing on known strings."""
import pytest

from specsample_cupy.tasks.metrics import corpus_wer, normalize_text, rouge_scores


@pytest.mark.parametrize("raw, expected", [
    ("Mr. Smith won't go, he said \"hello\"!", "mister smith will not go he said hello"),
    ("  HELLO,   World ", "hello world"),
    ("[noise] uh I mean (laughs) it's fine", "i mean it's fine"),
    ("Café — naïve…", "cafe naive"),
    ("It cost 1,000 dollars & 3.5 cents", "it cost 1000 dollars and 3 point 5 cents"),
    ("'quoted' o'clock", "quoted o'clock"),
])
def test_normalize_text(raw, expected):
    assert normalize_text(raw) == expected


def test_corpus_wer_counts_errors_over_reference_words():
    refs = ["the cat sat on the mat", "Hello world", "good morning"]
    hyps = ["The cat sat on a mat.", "hello, world!", "good morning everyone"]
    out = corpus_wer(refs, hyps)
    # one substitution, zero errors, one insertion over 6 + 2 + 2 reference words
    assert out["errors"] == 2 and out["ref_words"] == 10
    assert out["wer"] == pytest.approx(0.2)
    first, second, third = out["per_item"]
    assert first["substitutions"] == 1 and first["wer"] == pytest.approx(1 / 6)
    assert second["wer"] == 0.0
    assert third["insertions"] == 1


def test_wer_handles_empty_strings():
    out = corpus_wer(["hello there", "", ""], ["", "oops", ""])
    assert [p["deletions"] for p in out["per_item"]] == [2, 0, 0]
    assert [p["insertions"] for p in out["per_item"]] == [0, 1, 0]
    assert out["wer"] == pytest.approx(3 / 2)
    assert out["per_item"][1]["wer"] == float("inf") and out["per_item"][2]["wer"] == 0.0


def test_rouge_known_values():
    out = rouge_scores(["the cat sat on the mat", "a b c"], ["the cat sat on the mat", "x y z"])
    assert out["per_item"][0] == {"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0}
    assert out["per_item"][1] == {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    assert out["rouge1"] == pytest.approx(0.5)
    partial = rouge_scores(["the cat sat on the mat"], ["the cat was on the mat"])
    # 5 of 6 unigrams shared; bigrams "the cat", "on the", "the mat" of 5
    assert partial["rouge1"] == pytest.approx(5 / 6)
    assert partial["rouge2"] == pytest.approx(3 / 5)


def test_task_modules_import_without_torch():
    """The evaluation code must stay usable where torch is not installed."""
    import subprocess
    import sys

    code = ("import sys, cli, specsample_cupy.cli_eval, specsample_cupy.tasks.asr, "
            "specsample_cupy.tasks.summarize, specsample_cupy.tasks.audio, models.build_tiny_whisper; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    from pathlib import Path

    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])
