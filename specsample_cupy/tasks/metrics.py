"""Accuracy metrics for the task evaluations: word error rate and ROUGE.

WER follows the usual Whisper evaluation: both reference and hypothesis go
through Whisper's ``EnglishTextNormalizer`` (the ``whisper-normalizer``
package's copy of OpenAI's code, so scores compare with published tables:
spelled-out numbers become digits, British spellings American, contractions
and titles are expanded), then word-level edit operations are counted with
``jiwer``; the corpus WER is total errors over total reference words, not a
mean of per-utterance rates.
"""
from __future__ import annotations

import functools
from importlib.metadata import version


@functools.cache
def _english_normalizer():
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()


def normalizer_name() -> str:
    """What reports print next to a WER: the normaliser's class and package version."""
    return f"whisper_normalizer.english.EnglishTextNormalizer {version('whisper-normalizer')}"


def normalize_text(text: str) -> str:
    """Whisper's English normalisation, with runs of spaces collapsed."""
    return " ".join(_english_normalizer()(text or "").split())


def word_errors(reference: str, hypothesis: str) -> dict:
    """Edit counts between two already-normalised strings.

    ``jiwer`` rejects an empty reference, so that case is counted here: every
    hypothesis word is an insertion.
    """
    ref_words, hyp_words = reference.split(), hypothesis.split()
    if not ref_words:
        return {"substitutions": 0, "deletions": 0, "insertions": len(hyp_words),
                "hits": 0, "ref_words": 0}
    if not hyp_words:
        return {"substitutions": 0, "deletions": len(ref_words), "insertions": 0,
                "hits": 0, "ref_words": len(ref_words)}
    import jiwer

    out = jiwer.process_words(reference, hypothesis)
    return {"substitutions": out.substitutions, "deletions": out.deletions,
            "insertions": out.insertions, "hits": out.hits, "ref_words": len(ref_words)}


def utterance_wer(counts: dict) -> float:
    errors = counts["substitutions"] + counts["deletions"] + counts["insertions"]
    if counts["ref_words"] == 0:
        return 0.0 if errors == 0 else float("inf")
    return errors / counts["ref_words"]


def corpus_wer(references: list[str], hypotheses: list[str], *, normalize: bool = True) -> dict:
    """Corpus WER plus per-utterance counts.

    Returns {"wer", "errors", "ref_words", "normalizer", "per_item": [...]};
    ``normalizer`` names what normalised the texts (None with ``normalize=False``).
    """
    if len(references) != len(hypotheses):
        raise ValueError("references and hypotheses differ in length")
    per_item, errors, words = [], 0, 0
    for ref, hyp in zip(references, hypotheses):
        r, h = (normalize_text(ref), normalize_text(hyp)) if normalize else (ref, hyp)
        c = word_errors(r, h)
        c["wer"] = utterance_wer(c)
        c["reference_normalized"], c["hypothesis_normalized"] = r, h
        per_item.append(c)
        errors += c["substitutions"] + c["deletions"] + c["insertions"]
        words += c["ref_words"]
    wer = errors / words if words else (0.0 if errors == 0 else float("inf"))
    return {"wer": wer, "errors": errors, "ref_words": words,
            "normalizer": normalizer_name() if normalize else None, "per_item": per_item}


ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def rouge_scores(references: list[str], predictions: list[str]) -> dict:
    """Mean ROUGE-1/2/L F-measure (Porter stemming, as in the summarization literature).

    Returns {"rouge1", "rouge2", "rougeL", "per_item": [{"rouge1": f, ...}, ...]}.
    """
    if len(references) != len(predictions):
        raise ValueError("references and predictions differ in length")
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    per_item = []
    for ref, pred in zip(references, predictions):
        s = scorer.score(ref, pred)
        per_item.append({k: float(s[k].fmeasure) for k in ROUGE_TYPES})
    n = len(per_item)
    means = {k: (sum(p[k] for p in per_item) / n if n else 0.0) for k in ROUGE_TYPES}
    return {**means, "per_item": per_item}
