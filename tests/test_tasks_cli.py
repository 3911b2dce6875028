"""`specsample eval asr|summarize` end to end on tiny random models (CPU; GPU variants marked)."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("onnxruntime")

from models.build_tiny import build_tiny_pair  # noqa: E402
from models.build_tiny_whisper import build_tiny_whisper_pair  # noqa: E402
from specsample_cupy.cli.eval import eval_group  # noqa: E402

LIBRIVOX = Path("/usr/share/pocketsphinx/test/data/librivox")
SUMMARY_KEYS = {"items", "new_tokens", "rounds", "mean_accepted_per_round", "acceptance_rate",
                "verify_steps", "verify_time_per_step_s", "verify_time_total_s", "end_to_end_s"}
ITEM_KEYS = {"id", "token_ids", "new_tokens", "rounds", "draft_lengths", "accepted_per_round",
             "acceptance_rate", "mean_accepted_per_round", "verify_times_s", "verify_time_total_s",
             "end_to_end_s", "reference"}


def _gpu_ready():
    from specsample_cupy.runtime.ort_session import cuda_available
    return cuda_available()


@pytest.fixture(scope="module")
def whisper_pair(tmp_path_factory):
    return build_tiny_whisper_pair(str(tmp_path_factory.mktemp("whisper")))


@pytest.fixture(scope="module")
def text_pair(tmp_path_factory):
    return build_tiny_pair(str(tmp_path_factory.mktemp("text")), vocab_size=40)


def _save_audio(path, x, sr):
    """x [frames] or [frames, channels] float32. FLAC needs soundfile; PCM WAV falls back to the
    standard library (the GPU machine's image has no soundfile)."""
    try:
        import soundfile as sf
    except ImportError:
        import wave
        if path.suffix != ".wav":
            pytest.skip("writing non-WAV audio needs soundfile")
        x = x if x.ndim == 2 else x[:, None]
        with wave.open(str(path), "wb") as w:
            w.setnchannels(x.shape[1])
            w.setsampwidth(2)
            w.setframerate(sr)
            w.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
        return
    sf.write(path, x, sr)


def _write_wav(path, seconds, sr=16000, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    _save_audio(path, (0.2 * np.sin(2 * np.pi * 220 * t) + 0.02 * rng.standard_normal(t.size)).astype("float32"), sr)


def _invoke(args):
    result = CliRunner().invoke(eval_group, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _check_report(report, methods, accuracy_keys):
    assert report["methods"] == methods
    for m in methods:
        summary = report["summary"][m]
        assert SUMMARY_KEYS | set(accuracy_keys) <= set(summary)
        for item in report["items"][m]:
            assert ITEM_KEYS <= set(item)
            assert len(item["verify_times_s"]) == len(item["accepted_per_round"]) == len(item["draft_lengths"])
        if m != "target":
            assert summary["verify_steps"] > 0 and summary["verify_time_total_s"] > 0
    if "baseline" in methods:
        assert set(report["summary"]["exact"]["relative_to_baseline"]) >= {"verify_time_per_step_s"}


def _asr_manifest(tmp_path):
    """Three good utterances (one at 8 kHz stereo, resampled on load) and three bad entries.
    b is FLAC where soundfile is installed, else WAV."""
    try:
        import soundfile  # noqa: F401
        b_name = "b.flac"
    except ImportError:
        b_name = "b.wav"
    audio = tmp_path / "audio"
    audio.mkdir()
    _write_wav(audio / "a.wav", 1.0)
    _write_wav(audio / b_name, 1.5, seed=1)
    x = np.random.default_rng(2).standard_normal((8000, 2)).astype("float32") * 0.1
    _save_audio(audio / "c8k.wav", x, 8000)
    (audio / "broken.wav").write_bytes(b"RIFF....WAVEjunk")
    lines = [{"audio": "audio/a.wav", "text": "Hello there."},
             {"audio": "audio/broken.wav", "text": "unreadable"},
             {"audio": "audio/nothere.wav", "text": "missing"},
             {"audio": f"audio/{b_name}", "text": "General Kenobi!"},
             {"audio": "audio/c8k.wav", "text": "stereo eight kilohertz"}]
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text("\n".join(json.dumps(x) for x in lines) + "\n{oops\n")
    return manifest


def _run_asr(whisper_pair, tmp_path, device):
    pytest.importorskip("jiwer")   # the eval extra's metric library
    manifest = _asr_manifest(tmp_path)
    methods = ["baseline", "exact", "sigmoid", "target"]
    out = _invoke(["asr", "--target", whisper_pair[0], "--draft", whisper_pair[1], "--data", str(manifest),
                   "--methods", ",".join(methods), "--gamma", "3", "--max-new-tokens", "10",
                   "--device", device, "--json", str(tmp_path / "asr.json"),
                   "--plot", str(tmp_path / "asr.png"), "--no-progress"])
    for word in ("WER", "baseline", "exact", "sigmoid", "target", "verify ms/step", "skipped 3 item(s)",
                 "broken.wav", "nothere.wav", "malformed JSON"):
        assert word in out
    report = json.loads((tmp_path / "asr.json").read_text())
    _check_report(report, methods, ["wer"])
    assert report["items_evaluated"] == 3 and report["task"] == "asr"
    assert [i["id"] for i in report["items"]["exact"]] == ["a", "b", "c8k"]
    assert report["items"]["exact"][1]["reference"] == "General Kenobi!"
    assert {"hypothesis", "wer", "audio"} <= set(report["items"]["exact"][0])
    assert len(report["skipped"]) == 3
    assert (tmp_path / "asr.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return report


def test_eval_asr_cpu(whisper_pair, tmp_path):
    report = _run_asr(whisper_pair, tmp_path, "cpu")
    assert report["device"] == "cpu"


def _run_summarize(text_pair, tmp_path, device):
    pytest.importorskip("rouge_score")   # the eval extra's metric library
    data = tmp_path / "articles.jsonl"
    data.write_text("\n".join([
        json.dumps({"article": "The cat sat on the mat. It was sunny.", "summary": "A cat sat."}),
        json.dumps({"article": "No reference for this one, so the target's output is used."}),
        "not json at all",
        json.dumps({"summary": "an orphan summary"}),
    ]) + "\n")
    methods = ["baseline", "exact", "sigmoid"]
    out = _invoke(["summarize", "--target", text_pair[0], "--draft", text_pair[1], "--data", str(data),
                   "--methods", ",".join(methods), "--max-new-tokens", "12", "--device", device,
                   "--template", "Article: {article}\\nTL;DR:", "--json", str(tmp_path / "sum.json"),
                   "--plot", str(tmp_path / "sum.png"), "--no-progress"])
    assert "ROUGE-1" in out and "skipped 2 item(s)" in out
    report = json.loads((tmp_path / "sum.json").read_text())
    _check_report(report, methods, ["rouge1", "rouge2", "rougeL"])
    # ROUGE is over the item with a reference only; the other is decoded and counted, not scored.
    assert (report["items_with_reference"], report["items_without_reference"]) == (1, 1)
    items = report["items"]["exact"]
    assert [i["reference"] for i in items] == ["A cat sat.", None]
    assert "rouge1" in items[0] and "rouge1" not in items[1]
    assert report["summary"]["exact"]["rouge1"] == items[0]["rouge1"]
    assert report["summary"]["exact"]["rouge_items"] == 1 and "1 of 2 items" in out
    assert all("\n\n" not in i["prediction"] for i in report["items"]["exact"])
    assert report["template"] == "Article: {article}\\nTL;DR:"
    return report


def test_eval_summarize_cpu(text_pair, tmp_path):
    _run_summarize(text_pair, tmp_path, "cpu")


def test_limit_counts_usable_items(whisper_pair, tmp_path):
    manifest = _asr_manifest(tmp_path)
    _invoke(["asr", "--target", whisper_pair[0], "--draft", whisper_pair[1], "--data", str(manifest),
             "--methods", "exact", "--max-new-tokens", "4", "--limit", "2", "--device", "cpu",
             "--no-warmup", "--no-progress", "--json", str(tmp_path / "r.json")])
    report = json.loads((tmp_path / "r.json").read_text())
    # broken.wav (second line) is skipped and does not use up the limit
    assert [i["id"] for i in report["items"]["exact"]] == ["a", "b"]


def test_bad_options_give_clear_errors(text_pair, whisper_pair, tmp_path):
    data = tmp_path / "a.jsonl"
    data.write_text(json.dumps({"article": "x"}) + "\n")
    runner = CliRunner()
    r = runner.invoke(eval_group, ["summarize", "--target", text_pair[0], "--draft", text_pair[1],
                                   "--data", str(data), "--methods", "exact,nope"])
    assert r.exit_code == 2 and "unknown method" in r.output
    r = runner.invoke(eval_group, ["summarize", "--target", text_pair[0], "--draft", text_pair[1],
                                   "--data", str(data), "--template", "no placeholder", "--device", "cpu"])
    assert r.exit_code == 1 and "{article}" in r.output
    r = runner.invoke(eval_group, ["asr", "--target", whisper_pair[0], "--draft", whisper_pair[1],
                                   "--data", str(tmp_path), "--device", "cpu"])
    assert r.exit_code == 1 and "trans.txt" in r.output
    # A decoder-only pair is not a Whisper export (checked once the data has a usable utterance).
    (tmp_path / "m").mkdir()
    r = runner.invoke(eval_group, ["asr", "--target", text_pair[0], "--draft", text_pair[1],
                                   "--data", str(_asr_manifest(tmp_path / "m")), "--device", "cpu"])
    assert r.exit_code == 1 and "encoder_model.onnx" in r.output


@pytest.mark.skipif(not LIBRIVOX.is_dir(), reason="apt-get install pocketsphinx-testdata")
def test_eval_asr_on_librivox_folder(whisper_pair, tmp_path):
    """Real speech in LibriSpeech layout; one clip re-encoded at 44.1 kHz FLAC to exercise resampling."""
    sf = pytest.importorskip("soundfile")

    from specsample_cupy.tasks.audio import load_audio, resample

    folder = tmp_path / "lv"
    folder.mkdir()
    lines = []
    for line in (LIBRIVOX / "transcription").read_text().splitlines()[:2]:
        text, utt = line.rsplit("(", 1)
        utt = utt.rstrip(")").strip()
        lines.append(f"{utt} {' '.join(w for w in text.split() if w not in ('<s>', '</s>'))}")
        shutil.copy(LIBRIVOX / f"{utt}.wav", folder / f"{utt}.wav")
    first = lines[0].split()[0]
    x = load_audio(folder / f"{first}.wav")
    (folder / f"{first}.wav").unlink()
    sf.write(folder / f"{first}.flac", resample(x, 16000, 44100), 44100)
    (folder / "lv.trans.txt").write_text("\n".join(lines) + "\n")
    _invoke(["asr", "--target", whisper_pair[0], "--draft", whisper_pair[1], "--data", str(folder),
             "--methods", "exact,target", "--max-new-tokens", "8", "--device", "cpu", "--no-warmup",
             "--json", str(tmp_path / "lv.json"), "--no-progress"])
    report = json.loads((tmp_path / "lv.json").read_text())
    assert report["items_evaluated"] == 2 and not report["skipped"]
    item = report["items"]["exact"][0]
    assert item["id"] == first and item["audio"].endswith(".flac")
    assert item["reference"].startswith("and mister john dashwood")
    assert report["accuracy_per_item"]["exact"][0]["ref_words"] == 22


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ready(), reason="needs CuPy, a CUDA device and onnxruntime-gpu")
def test_eval_asr_gpu(whisper_pair, tmp_path):
    report = _run_asr(whisper_pair, tmp_path, "cuda")
    assert report["device"] == "cuda"


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ready(), reason="needs CuPy, a CUDA device and onnxruntime-gpu")
def test_eval_summarize_gpu(text_pair, tmp_path):
    _run_summarize(text_pair, tmp_path, "cuda")


def _fails(args):
    """Run a command that must fail: exit 1, no table on stdout, `Error: ...` last on stderr."""
    try:
        runner = CliRunner(mix_stderr=False)
    except TypeError:            # click >= 8.2 keeps stderr apart anyway
        runner = CliRunner()
    result = runner.invoke(eval_group, args + ["--device", "cpu", "--no-progress"], catch_exceptions=False)
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    return result.stderr


def test_summarize_without_usable_articles_fails(text_pair, tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text("not json\n" + json.dumps({"summary": "no article"}) + "\n")
    err = _fails(["summarize", "--target", text_pair[0], "--draft", text_pair[1], "--data", str(data)])
    assert err.splitlines()[-1] == f"Error: no usable articles in {data} (all 2 skipped)"
    assert f"skipped {data}:1: line 1: malformed JSON" in err and "missing \"article\"" in err
    # Every article too long for the context: skipped while running, after the models loaded.
    data.write_text(json.dumps({"article": "word " * 400}) + "\n")
    err = _fails(["summarize", "--target", text_pair[0], "--draft", text_pair[1], "--data", str(data)])
    assert err.splitlines()[-1] == f"Error: no usable articles in {data} (all 1 skipped)"
    assert "tokens" in err and "ROUGE" not in err


def test_asr_without_usable_utterances_fails(whisper_pair, tmp_path):
    pytest.importorskip("jiwer")
    (tmp_path / "broken.wav").write_bytes(b"RIFF....WAVEjunk")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"audio": "nothere.wav", "text": "missing"}) + "\n")
    args = ["asr", "--target", whisper_pair[0], "--draft", whisper_pair[1], "--data", str(manifest)]
    err = _fails(args)
    assert err.splitlines()[-1] == f"Error: no usable utterances in {manifest} (all 1 skipped)"
    assert "audio file not found" in err
    # The audio exists but cannot be read: skipped while running.
    manifest.write_text(json.dumps({"audio": "broken.wav", "text": "unreadable"}) + "\n")
    err = _fails(args)
    assert err.splitlines()[-1] == f"Error: no usable utterances in {manifest} (all 1 skipped)"
    assert "broken.wav" in err and "WER" not in err
