"""Accuracy metrics for the task evaluations: word error rate and ROUGE.

WER follows the usual Whisper evaluation: both reference and hypothesis are
normalised first (a compact subset of Whisper's ``EnglishTextNormalizer``),
then word-level edit operations are counted with ``jiwer``; the corpus WER is
total errors over total reference words, not a mean of per-utterance rates.
"""
from __future__ import annotations

import re
import unicodedata

# Spoken-form expansions Whisper's English normaliser applies, so that a
# hypothesis "Mr. Smith won't" matches a reference "mister smith will not".
_TITLES = {
    r"\bmr\b": "mister", r"\bmrs\b": "missus", r"\bms\b": "miss", r"\bdr\b": "doctor",
    r"\bprof\b": "professor", r"\bst\b": "saint", r"\bjr\b": "junior", r"\bsr\b": "senior",
    r"\bcapt\b": "captain", r"\bgen\b": "general", r"\bgov\b": "governor", r"\blt\b": "lieutenant",
    r"\bsgt\b": "sergeant", r"\brev\b": "reverend", r"\bhon\b": "honorable",
}
_CONTRACTIONS = {
    r"\bwon't\b": "will not", r"\bcan't\b": "can not", r"\blet's\b": "let us",
    r"\bain't\b": "aint", r"\by'all\b": "you all", r"\bwanna\b": "want to",
    r"\bgotta\b": "got to", r"\bgonna\b": "going to", r"\bi'ma\b": "i am going to",
    r"\bimma\b": "i am going to", r"\bwoulda\b": "would have", r"\bcoulda\b": "could have",
    r"\bshoulda\b": "should have", r"\bma'am\b": "madam",
    r"n't\b": " not", r"'re\b": " are", r"'d\b": " would", r"'ll\b": " will",
    r"'t\b": " not", r"'ve\b": " have", r"'m\b": " am",
}
# Hesitations are not words in LibriSpeech-style references.
_FILLERS = re.compile(r"\b(hmm+|mm+|mhm|uh+|um+|ah+|er+)\b")
_BRACKETS = re.compile(r"[<\[][^>\]]*[>\]]|\([^)]*\)")
_SYMBOLS = {"%": " percent ", "&": " and ", "@": " at ", "+": " plus ", "$": " dollars "}
_NON_WORD = re.compile(r"[^\w\s']|_")


def normalize_text(text: str) -> str:
    """Lower-case, spell out titles/contractions, drop fillers, brackets and punctuation.

    Apostrophes survive inside words ("o'clock") but not at word edges.
    """
    s = unicodedata.normalize("NFKC", text or "").lower()
    s = s.replace("\u2019", "'").replace("\u2018", "'")
    s = _BRACKETS.sub(" ", s)                     # [noise], <unk>, (laughs)
    # Strip accents: Whisper's normaliser maps "café" to "cafe".
    s = "".join(c for c in unicodedata.normalize("NFKD", s) if not unicodedata.combining(c))
    for symbol, word in _SYMBOLS.items():
        s = s.replace(symbol, word)
    s = re.sub(r"(\d),(\d)", r"\1\2", s)          # 1,000 -> 1000
    s = re.sub(r"\.(?=\s|$)", " ", s)             # sentence dots; keep "3.5"
    for pattern, repl in _TITLES.items():
        s = re.sub(pattern, repl, s)
    for pattern, repl in _CONTRACTIONS.items():
        s = re.sub(pattern, repl, s)
    s = re.sub(r"(\d)\.(\d)", r"\1 point \2", s)
    s = _NON_WORD.sub(" ", s)
    s = re.sub(r"(^|\s)'+|'+(?=\s|$)", " ", s)    # quotes, not apostrophes
    s = _FILLERS.sub(" ", s)
    return " ".join(s.split())


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
    """Corpus WER plus per-utterance counts: {"wer", "errors", "ref_words", "per_item": [...]}."""
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
    return {"wer": wer, "errors": errors, "ref_words": words, "per_item": per_item}


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
