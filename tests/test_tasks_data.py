"""Evaluation data readers: good items load, bad ones are skipped with clear reasons."""
import json
import shutil
from pathlib import Path

import pytest

from specsample_cupy.tasks.datasets import (DataError, load_asr_items, load_summary_items)

LIBRIVOX = Path("/usr/share/pocketsphinx/test/data/librivox")


def _wav(path: Path, seconds=0.5, sr=16000):
    import numpy as np
    import soundfile as sf

    t = np.arange(int(seconds * sr)) / sr
    sf.write(path, (0.1 * np.sin(2 * np.pi * 440 * t)).astype("float32"), sr)


def test_librispeech_folder_with_bad_entries(tmp_path):
    chapter = tmp_path / "19" / "198"
    chapter.mkdir(parents=True)
    for utt in ("19-198-0000", "19-198-0001", "19-198-0003"):
        _wav(chapter / f"{utt}.wav")
    (chapter / "19-198-0002.flac").write_bytes(b"")           # listed with no text below
    (chapter / "19-198.trans.txt").write_text(
        "19-198-0000 HELLO WORLD\n"
        "19-198-0001 SECOND ONE\n"
        "19-198-0002\n"                                          # no transcript text
        "19-198-0009 NO AUDIO FOR THIS\n")
    items, skipped = load_asr_items(tmp_path)
    assert [i.id for i in items] == ["19-198-0000", "19-198-0001"]
    assert items[0].text == "HELLO WORLD" and items[0].audio.name == "19-198-0000.wav"
    reasons = {s.id: s.reason for s in skipped}
    assert "missing transcript text" in reasons["19-198-0002"]
    assert "no audio file" in reasons["19-198-0009"]
    assert "missing transcript" in reasons["19-198-0003"]      # audio with no line
    assert all(":" in s.source for s in skipped if s.id != "19-198-0003")


def test_manifest_resolves_relative_paths_and_skips_bad_lines(tmp_path):
    (tmp_path / "audio").mkdir()
    _wav(tmp_path / "audio" / "a.wav")
    _wav(tmp_path / "audio" / "b.wav")
    lines = [json.dumps({"audio": "audio/a.wav", "text": "alpha"}),
             "{not json",
             json.dumps({"audio": "audio/missing.wav", "text": "gone"}),
             json.dumps({"audio": str(tmp_path / "audio" / "b.wav"), "text": "beta", "id": "bee"}),
             json.dumps({"audio": "audio/a.wav"}),
             json.dumps(["a", "list"]),
             ""]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(lines))
    items, skipped = load_asr_items(manifest)
    assert [(i.id, i.text) for i in items] == [("a", "alpha"), ("bee", "beta")]
    assert items[0].audio == tmp_path / "audio" / "a.wav"
    reasons = [s.reason for s in skipped]
    assert any("malformed JSON" in r for r in reasons)
    assert any("audio file not found" in r for r in reasons)
    assert any("missing transcript" in r for r in reasons)
    assert any("expected a JSON object" in r for r in reasons)
    assert {s.source.rsplit(":", 1)[1] for s in skipped} == {"2", "3", "5", "6"}


def test_missing_paths_are_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_asr_items(tmp_path / "nope")
    with pytest.raises(DataError, match="no \\*.trans.txt"):
        load_asr_items(tmp_path)
    with pytest.raises(DataError, match="does not exist"):
        load_summary_items(tmp_path / "nope.jsonl")


def test_summary_jsonl(tmp_path):
    f = tmp_path / "s.jsonl"
    f.write_text("\n".join([
        json.dumps({"article": "A long text.", "summary": "Short."}),
        json.dumps({"article": "No reference here."}),
        json.dumps({"summary": "orphan"}),
        "[1, 2",
        json.dumps({"article": "x", "summary": 3}),
    ]))
    items, skipped = load_summary_items(f)
    assert [(i.article, i.summary) for i in items] == [("A long text.", "Short."),
                                                        ("No reference here.", None)]
    assert [s.source.rsplit(":", 1)[1] for s in skipped] == ["3", "4", "5"]
    assert "missing \"article\"" in skipped[0].reason
    assert "malformed JSON" in skipped[1].reason


@pytest.mark.skipif(not LIBRIVOX.is_dir(), reason="apt-get install pocketsphinx-testdata")
def test_pocketsphinx_librivox_as_librispeech_folder(tmp_path):
    """The Debian LibriVox clips, laid out LibriSpeech-style, parse with their transcripts."""
    folder = librivox_as_librispeech(tmp_path)
    items, skipped = load_asr_items(folder)
    assert len(items) == 5 and not skipped
    assert items[1].text == "he was not an ill disposed young man"


def librivox_as_librispeech(root: Path) -> Path:
    """Copy the pocketsphinx LibriVox clips into root/lv/<id>.wav + lv.trans.txt."""
    folder = root / "lv"
    folder.mkdir()
    lines = []
    for line in (LIBRIVOX / "transcription").read_text().splitlines():
        text, utt = line.rsplit("(", 1)
        utt = utt.rstrip(")").strip()
        words = [w for w in text.split() if w not in ("<s>", "</s>")]
        shutil.copy(LIBRIVOX / f"{utt}.wav", folder / f"{utt}.wav")
        lines.append(f"{utt} {' '.join(words)}")
    (folder / "lv.trans.txt").write_text("\n".join(lines) + "\n")
    return folder
