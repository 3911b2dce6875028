"""Whisper front end against independent implementations (librosa, scipy, transformers)."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specsample_cupy.tasks import audio as A

LIBRIVOX = Path("/usr/share/pocketsphinx/test/data/librivox")
needs_librivox = pytest.mark.skipif(not LIBRIVOX.is_dir(),
                                    reason="apt-get install pocketsphinx-testdata")


def _speech():
    """A real LibriVox clip when pocketsphinx-testdata is installed, else a synthetic chirp."""
    clip = LIBRIVOX / "sense_and_sensibility_01_austen_64kb-0880.wav"
    if clip.is_file():
        return A.load_audio(clip)
    t = np.arange(3 * A.SAMPLE_RATE) / A.SAMPLE_RATE
    rng = np.random.default_rng(0)
    return (0.3 * np.sin(2 * np.pi * (200 + 600 * t) * t) + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_match_librosa(n_mels):
    librosa = pytest.importorskip("librosa")
    ref = librosa.filters.mel(sr=16000, n_fft=400, n_mels=n_mels, htk=False, norm="slaney")
    ours = A.mel_filters(n_mels)
    assert ours.shape == (n_mels, 201)
    np.testing.assert_allclose(ours, ref, atol=1e-7, rtol=1e-5)


@pytest.mark.slow   # librosa's first import compiles with numba: 10-50 s on a fresh 2-core machine
def test_stft_power_matches_librosa_and_direct_dft():
    librosa = pytest.importorskip("librosa")
    x = _speech()[:16000].astype(np.float64)
    ours = A.stft_power(x)
    ref = np.abs(librosa.stft(x, n_fft=400, hop_length=160, window="hann", center=True,
                              pad_mode="reflect")) ** 2
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, atol=1e-4 * ref.max(), rtol=1e-6)
    # One frame by the DFT's definition, with the periodic Hann window.
    padded = np.pad(x, 200, mode="reflect")
    n = np.arange(400)
    frame = padded[160 * 7:160 * 7 + 400] * (0.5 - 0.5 * np.cos(2 * np.pi * n / 400))
    dft = np.exp(-2j * np.pi * np.outer(np.arange(201), n) / 400) @ frame
    np.testing.assert_allclose(ours[:, 7], np.abs(dft) ** 2, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("orig_sr", [8000, 22050, 44100, 48000])
def test_resample_matches_scipy_resample_poly(orig_sr):
    signal = pytest.importorskip("scipy.signal")
    rng = np.random.default_rng(orig_sr)
    x = rng.standard_normal(orig_sr // 2)
    g = np.gcd(orig_sr, 16000)
    ref = signal.resample_poly(x, 16000 // g, orig_sr // g)
    ours = A.resample(x, orig_sr, 16000)
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, atol=1e-5)


def test_log_mel_shape_range_and_padding():
    x = _speech()
    feats = A.log_mel_spectrogram(x, 80)
    assert feats.shape == (80, A.N_FRAMES) and feats.dtype == np.float32
    # After the clamp every value lies within 8/4 = 2 of the maximum.
    assert feats.max() - feats.min() <= 2.0 + 1e-6
    batch = A.batch_features([x, x[: len(x) // 2]], 128)
    assert batch.shape == (2, 128, A.N_FRAMES)
    np.testing.assert_allclose(batch[0], A.log_mel_spectrogram(x, 128), atol=1e-6)
    long = np.tile(x, 40)                       # > 30 s is trimmed to 30 s
    assert A.log_mel_spectrogram(long).shape == (80, A.N_FRAMES)


_HF_SCRIPT = """
import sys, numpy as np
from transformers import WhisperFeatureExtractor
x = np.load(sys.argv[1])
for n in (80, 128):
    fe = WhisperFeatureExtractor(feature_size=n)
    np.save(sys.argv[2] + f"_{n}.npy", fe(x, sampling_rate=16000, return_tensors="np").input_features[0])
"""


def test_log_mel_matches_transformers_feature_extractor(tmp_path):
    pytest.importorskip("transformers")
    # transformers may import torch: run it in a child so this process stays torch-free.
    x = _speech()
    np.save(tmp_path / "x.npy", x)
    subprocess.run([sys.executable, "-c", _HF_SCRIPT, str(tmp_path / "x.npy"), str(tmp_path / "ref")],
                   check=True, env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"})
    for n in (80, 128):
        ref = np.load(tmp_path / f"ref_{n}.npy")
        np.testing.assert_allclose(A.log_mel_spectrogram(x, n), ref, atol=1e-4)


def test_load_audio_downmixes_and_resamples(tmp_path):
    sf = pytest.importorskip("soundfile")
    x = _speech()[:16000]
    up = A.resample(x, 16000, 44100)
    sf.write(tmp_path / "stereo44k.flac", np.stack([up, up], axis=1), 44100)
    back = A.load_audio(tmp_path / "stereo44k.flac")
    assert back.dtype == np.float32 and back.ndim == 1
    assert abs(len(back) - len(x)) <= 1
    # Up and back down again loses only the band edge and the FLAC quantisation.
    n = min(len(back), len(x)) - 200
    assert np.abs(back[200:n] - x[200:n]).max() < 0.02


def test_load_audio_errors_are_clear(tmp_path):
    bad = tmp_path / "broken.wav"
    bad.write_bytes(b"RIFF not really a wav file")
    with pytest.raises(A.AudioError, match="cannot read audio .*broken.wav"):
        A.load_audio(bad)
    with pytest.raises(A.AudioError, match="cannot read audio"):
        A.load_audio(tmp_path / "missing.flac")


@needs_librivox
def test_librivox_clips_load_as_16k_mono():
    for wav in sorted(LIBRIVOX.glob("*.wav")):
        x = A.load_audio(wav)
        assert x.ndim == 1 and 1.0 < len(x) / A.SAMPLE_RATE < 30.0
        assert np.isfinite(A.log_mel_spectrogram(x)).all()


@pytest.mark.gpu
def test_log_mel_cupy_matches_numpy():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except Exception:
        pytest.skip("no CUDA device")
    x = _speech()
    gpu = A.log_mel_spectrogram(cupy.asarray(x), 80, xp=cupy)
    np.testing.assert_allclose(cupy.asnumpy(gpu), A.log_mel_spectrogram(x, 80), atol=1e-4)
    assert gpu.shape == (80, 3000)


def test_pcm_wav_reader_matches_soundfile(tmp_path):
    sf = pytest.importorskip("soundfile")
    rng = np.random.default_rng(3)
    x = (rng.uniform(-0.9, 0.9, size=(8000, 2))).astype(np.float32)
    for subtype in ("PCM_16", "PCM_32", "PCM_U8"):
        path = tmp_path / f"x_{subtype}.wav"
        sf.write(path, x, 16000, subtype=subtype)
        data, rate = A.read_pcm_wav(path)
        ref, ref_rate = sf.read(str(path), dtype="float32", always_2d=True)
        assert rate == ref_rate == 16000 and data.shape == ref.shape
        np.testing.assert_allclose(data, ref, atol=1e-6)
    (tmp_path / "bad.wav").write_bytes(b"RIFF....WAVEjunk")
    with pytest.raises(A.AudioError, match="cannot read audio"):
        A.read_pcm_wav(tmp_path / "bad.wav")
