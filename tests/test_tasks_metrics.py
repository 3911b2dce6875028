"""WER and ROUGE plumbing on known strings; WER normalisation is Whisper's English normaliser."""
import pytest

from specsample_cupy.tasks.metrics import corpus_wer, normalize_text, normalizer_name, rouge_scores


@pytest.mark.parametrize("raw, expected", [
    # numbers: spelled-out numbers become digits, successive single digits one number
    ("twenty three", "23"),
    ("Twenty-three", "23"),
    ("five five", "55"),
    ("one oh one", "101"),
    ("seventy five percent", "75%"),
    ("the first of May", "the 1st of may"),
    # punctuation
    ("Hello, world!", "hello world"),
    ("He was not an ill-disposed young man.", "he was not an ill disposed young man"),
    ("Café — naïve", "cafe naive"),
    # casing
    ("  HELLO   World ", "hello world"),
    # contractions and titles
    ("Mr. Smith won't go", "mister smith will not go"),
    ("it's fine, I'm sure they're here", "it is fine i am sure they are here"),
    # British spellings, hesitations and bracketed noise
    ("[noise] uh I mean (laughs) the colour", "i mean the color"),
])
def test_normalize_text_is_whispers_english_normaliser(raw, expected):
    assert normalize_text(raw) == expected


@pytest.mark.parametrize("reference, hypothesis", [
    ("twenty three people came", "23 people came."),
    ("call five five", "Call 55"),
    ("He won't say MISTER Brown's colour", "he will not say Mr. Brown's color"),
])
def test_spoken_and_written_forms_score_no_errors(reference, hypothesis):
    assert corpus_wer([reference], [hypothesis])["errors"] == 0


def test_wer_names_its_normaliser():
    name = normalizer_name()
    assert name.startswith("whisper_normalizer.english.EnglishTextNormalizer ")
    assert corpus_wer(["a"], ["a"])["normalizer"] == name
    assert corpus_wer(["a"], ["a"], normalize=False)["normalizer"] is None


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

    code = ("import sys, cli, specsample_cupy.cli.eval, specsample_cupy.tasks.asr, "
            "specsample_cupy.tasks.summarize, specsample_cupy.tasks.audio, models.build_tiny_whisper, "
            "models.fetch_whisper_base, whisper_normalizer.english; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    from pathlib import Path

    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])
