"""Evaluation data: ASR transcripts/manifests and summarization JSONL.

Readers never stop at a bad item: each one becomes a ``Skipped`` entry with a
message that names the file, the line and what is wrong, and the run goes on
with the rest. Only a path that holds no usable data at all is an error.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

AUDIO_EXTENSIONS = (".flac", ".wav", ".ogg", ".mp3", ".opus")


class DataError(ValueError):
    """The data path as a whole cannot be used."""


class NoUsableItems(DataError):
    """Every item was skipped: there is nothing to score, and a table of zeros would read as a result.
    ``skipped`` holds why, item by item."""

    def __init__(self, data, what: str, skipped: list):
        self.skipped = list(skipped)
        reason = f"all {len(self.skipped)} skipped" if self.skipped else "none found"
        super().__init__(f"no usable {what} in {data} ({reason})")


@dataclass
class AsrItem:
    id: str
    audio: Path
    text: str
    source: str            # "file:line", for messages


@dataclass
class SummaryItem:
    id: str
    article: str
    summary: str | None    # None: compare against target-only decoding instead
    source: str


@dataclass
class Skipped:
    id: str
    source: str
    reason: str

    def to_dict(self):
        return asdict(self)

    def __str__(self):
        return f"{self.source}: {self.id}: {self.reason}"


# --------------------------------------------------------------------------- ASR

def load_asr_items(path) -> tuple[list[AsrItem], list[Skipped]]:
    """Utterances from a LibriSpeech-style folder or a JSONL manifest.

    Folder: every ``*.trans.txt`` below it holds ``<utt-id> TEXT`` lines; the
    audio is ``<utt-id>.flac`` (or .wav, ...) beside the transcript. Audio files
    with no transcript line are reported as skipped.
    Manifest: one JSON object per line, ``{"audio": path, "text": reference}``
    (optional ``"id"``); relative audio paths are resolved against the
    manifest's folder.
    """
    path = Path(path)
    if path.is_dir():
        return _load_librispeech_dir(path)
    if path.is_file():
        return _load_asr_manifest(path)
    raise DataError(f"data path {path} does not exist")


def _find_audio(folder: Path, utt_id: str) -> Path | None:
    for ext in AUDIO_EXTENSIONS:
        candidate = folder / f"{utt_id}{ext}"
        if candidate.is_file():
            return candidate
    return None


def _load_librispeech_dir(root: Path):
    transcripts = sorted(root.rglob("*.trans.txt"))
    if not transcripts:
        raise DataError(f"no *.trans.txt transcripts under {root} "
                        "(expected LibriSpeech layout: '<utt-id> TEXT' lines, audio beside them)")
    items, skipped, listed = [], [], set()   # listed: (folder, utt-id) named by a transcript line
    for trans in transcripts:
        try:
            lines = trans.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            skipped.append(Skipped(trans.name, str(trans), f"cannot read transcript: {exc}"))
            continue
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{trans}:{lineno}"
            parts = line.strip().split(maxsplit=1)
            listed.add((trans.parent, parts[0]))
            if len(parts) < 2:
                skipped.append(Skipped(parts[0], where,
                                       "missing transcript text (expected '<utt-id> TEXT')"))
                continue
            utt_id, text = parts
            audio = _find_audio(trans.parent, utt_id)
            if audio is None:
                skipped.append(Skipped(utt_id, where, f"no audio file {utt_id}"
                                       f"{{{','.join(AUDIO_EXTENSIONS)}}} in {trans.parent}"))
                continue
            items.append(AsrItem(utt_id, audio, text, where))
    for folder in sorted({t.parent for t in transcripts}):
        for audio in sorted(folder.iterdir()):
            if audio.suffix.lower() in AUDIO_EXTENSIONS and (folder, audio.stem) not in listed:
                skipped.append(Skipped(audio.stem, str(audio), "missing transcript: no line for "
                                       f"this utterance in {folder}/*.trans.txt"))
    return items, skipped


def _read_jsonl(path: Path):
    """Yield (lineno, object-or-None, error-message-or-None) for each non-blank line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from exc
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            yield lineno, None, f"malformed JSON ({exc.msg} at column {exc.colno})"
            continue
        if not isinstance(obj, dict):
            yield lineno, None, f"expected a JSON object, got {type(obj).__name__}"
            continue
        yield lineno, obj, None


def _load_asr_manifest(path: Path):
    items, skipped = [], []
    base = path.parent
    for lineno, obj, error in _read_jsonl(path):
        where = f"{path}:{lineno}"
        if error:
            skipped.append(Skipped(f"line {lineno}", where, error))
            continue
        audio_field = obj.get("audio")
        utt_id = str(obj.get("id") or (Path(audio_field).stem if isinstance(audio_field, str)
                                        else f"line {lineno}"))
        if not isinstance(audio_field, str) or not audio_field:
            skipped.append(Skipped(utt_id, where, "missing \"audio\" path"))
            continue
        text = obj.get("text")
        if not isinstance(text, str) or not text.strip():
            skipped.append(Skipped(utt_id, where, "missing transcript (\"text\")"))
            continue
        audio = Path(audio_field)
        if not audio.is_absolute():
            audio = base / audio
        if not audio.is_file():
            skipped.append(Skipped(utt_id, where, f"audio file not found: {audio}"))
            continue
        items.append(AsrItem(utt_id, audio, text, where))
    if not items and not skipped:
        raise DataError(f"manifest {path} has no entries")
    return items, skipped


# --------------------------------------------------------------------------- summarization

def load_summary_items(path) -> tuple[list[SummaryItem], list[Skipped]]:
    """Articles from JSONL lines ``{"article": ..., "summary": ...}``; summary may be absent."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    items, skipped = [], []
    for lineno, obj, error in _read_jsonl(path):
        where = f"{path}:{lineno}"
        item_id = f"line {lineno}"
        if error:
            skipped.append(Skipped(item_id, where, error))
            continue
        item_id = str(obj.get("id") or item_id)
        article = obj.get("article")
        if not isinstance(article, str) or not article.strip():
            skipped.append(Skipped(item_id, where, "missing \"article\" text"))
            continue
        summary = obj.get("summary")
        if summary is not None and not isinstance(summary, str):
            skipped.append(Skipped(item_id, where, "\"summary\" must be a string"))
            continue
        items.append(SummaryItem(item_id, article, summary if summary and summary.strip() else None,
                                 where))
    if not items and not skipped:
        raise DataError(f"{path} has no entries")
    return items, skipped
