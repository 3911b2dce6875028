"""Whisper's audio front end without torch: loading, resampling, log-mel features.

The log-mel spectrogram follows openai/whisper's ``log_mel_spectrogram`` (and
Hugging Face's ``WhisperFeatureExtractor``): the waveform is padded or trimmed
to 30 s, a centred STFT with a periodic Hann window (n_fft 400, hop 160) gives
the power spectrum, Slaney mel filters project it to 80 or 128 bins, then
``log10`` with a floor of 1e-10, clamp to (max - 8) per utterance, and
``(x + 4) / 4``. The last STFT frame is dropped so 30 s give 3000 frames.

The feature code takes an array module ``xp`` (numpy or cupy) so the same
lines run on the CPU or the GPU; resampling and filter design run in numpy.
"""
from __future__ import annotations

from functools import lru_cache
from math import gcd

import numpy as np

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_LENGTH_S = 30
N_SAMPLES = SAMPLE_RATE * CHUNK_LENGTH_S        # 480000 samples in a 30 s window
N_FRAMES = N_SAMPLES // HOP_LENGTH              # 3000 frames in a 30 s window


class AudioError(ValueError):
    """An audio file that cannot be used (unreadable, empty, bad format)."""


# --------------------------------------------------------------------------- loading

def load_audio(path, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Mono float32 waveform in [-1, 1] at ``sample_rate`` from a WAV/FLAC/OGG file."""
    try:
        import soundfile
    except ImportError as exc:  # without soundfile, plain PCM WAV still reads (standard library)
        if str(path).lower().endswith(".wav"):
            data, sr = read_pcm_wav(path)
        else:
            raise AudioError("reading audio other than PCM WAV needs the 'soundfile' package "
                             "(pip install 'specsample-cupy[eval]')") from exc
    else:
        try:
            data, sr = soundfile.read(str(path), dtype="float32", always_2d=True)
        except Exception as exc:  # soundfile raises several types (LibsndfileError, RuntimeError)
            raise AudioError(f"cannot read audio {path}: {exc}") from exc
    if data.shape[0] == 0:
        raise AudioError(f"audio {path} has no samples")
    # Down-mix by averaging channels, like ffmpeg's "-ac 1" used by whisper.
    mono = data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]
    if sr != sample_rate:
        mono = resample(mono, sr, sample_rate)
    return np.ascontiguousarray(mono, dtype=np.float32)


def read_pcm_wav(path) -> tuple[np.ndarray, int]:
    """(samples [frames, channels] float32 in [-1, 1], rate) of an 8/16/32-bit PCM WAV file,
    with the standard library's wave module."""
    import wave
    try:
        with wave.open(str(path), "rb") as w:
            channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            raw = w.readframes(w.getnframes())
    except (wave.Error, EOFError, OSError) as exc:
        raise AudioError(f"cannot read audio {path}: {exc}") from exc
    if width == 1:
        data = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width in (2, 4):
        data = np.frombuffer(raw, f"<i{width}").astype(np.float32) / float(2 ** (8 * width - 1))
    else:
        raise AudioError(f"cannot read audio {path}: {8 * width}-bit PCM is not supported without soundfile")
    return data.reshape(-1, channels), rate


# --------------------------------------------------------------------------- resampling

@lru_cache(maxsize=16)
def _lowpass(up: int, down: int) -> tuple[np.ndarray, int]:
    """Kaiser-windowed sinc low-pass (beta 5, 10 zero crossings per side).

    Same design as scipy.signal.resample_poly's default, so results match it.
    """
    max_rate = max(up, down)
    cutoff = 1.0 / max_rate                       # relative to the Nyquist rate
    half_len = 10 * max_rate
    n = np.arange(2 * half_len + 1) - half_len
    h = cutoff * np.sinc(cutoff * n) * np.kaiser(2 * half_len + 1, 5.0)
    h /= h.sum()                                  # unit gain at DC
    return h * up, half_len


def resample(x: np.ndarray, orig_sr: int, new_sr: int, *, chunk: int = 65536) -> np.ndarray:
    """Polyphase resampling of a 1-D signal by the rational factor new_sr / orig_sr.

    Output sample m sits at input time m * orig_sr / new_sr and is
    ``sum_j x[j] * h[m*down + half_len - j*up]`` with the filter above: only the
    ~2*half_len/up taps that are non-zero are gathered, in chunks of outputs.
    """
    x = np.asarray(x, dtype=np.float64)
    if orig_sr <= 0 or new_sr <= 0:
        raise ValueError("sample rates must be positive")
    g = gcd(int(orig_sr), int(new_sr))
    up, down = int(new_sr) // g, int(orig_sr) // g
    if up == down:
        return x.astype(np.float32)
    h, half_len = _lowpass(up, down)
    n_in = x.shape[0]
    n_out = -(-n_in * up // down)                 # ceil, as resample_poly
    taps = -(-len(h) // up) + 1                   # input samples that can touch one output
    out = np.empty(n_out, dtype=np.float64)
    xp_pad = np.concatenate([x, np.zeros(1)])     # index n_in is a zero sample
    for start in range(0, n_out, chunk):
        m = np.arange(start, min(start + chunk, n_out))
        t = m * down + half_len                   # position in the upsampled domain
        j_hi = t // up                            # newest input sample under the filter
        j = j_hi[:, None] - np.arange(taps)[None, :]
        k = t[:, None] - j * up                   # filter index for each (output, input) pair
        valid = (j >= 0) & (j < n_in) & (k < len(h))
        j = np.where(valid, j, n_in)
        k = np.where(valid, k, 0)
        out[m] = (xp_pad[j] * np.where(valid, h[k], 0.0)).sum(axis=1)
    return out.astype(np.float32)


# --------------------------------------------------------------------------- mel filters

def _hz_to_mel(f):
    """Slaney's auditory-toolbox mel scale (linear below 1 kHz, log above)."""
    f = np.asarray(f, dtype=np.float64)
    f_sp = 200.0 / 3
    min_log_hz, logstep = 1000.0, np.log(6.4) / 27.0
    min_log_mel = min_log_hz / f_sp
    mel = f / f_sp
    return np.where(f >= min_log_hz,
                    min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, mel)


def _mel_to_hz(m):
    m = np.asarray(m, dtype=np.float64)
    f_sp = 200.0 / 3
    min_log_hz, logstep = 1000.0, np.log(6.4) / 27.0
    min_log_mel = min_log_hz / f_sp
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)


@lru_cache(maxsize=8)
def mel_filters(n_mels: int = 80, *, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT,
                fmin: float = 0.0, fmax: float | None = None) -> np.ndarray:
    """Slaney-normalised triangular mel filter bank, float32 [n_mels, 1 + n_fft // 2].

    The construction is librosa's ``filters.mel(htk=False, norm='slaney')``,
    which is what Whisper ships in its ``mel_filters.npz``.
    """
    fmax = sample_rate / 2 if fmax is None else fmax
    fft_freqs = np.fft.rfftfreq(n_fft, 1.0 / sample_rate)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2:] - mel_f[:-2]))[:, None]   # equal area per filter
    weights = weights.astype(np.float32)
    weights.setflags(write=False)                            # shared through the cache
    return weights


# --------------------------------------------------------------------------- features

def hann_window(n: int = N_FFT) -> np.ndarray:
    """Periodic Hann window (torch.hann_window's default), as used by Whisper."""
    return (0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n)).astype(np.float64)


def pad_or_trim(audio, length: int = N_SAMPLES, *, xp=np):
    """Zero-pad or cut the last axis to ``length`` samples."""
    audio = xp.asarray(audio)
    n = audio.shape[-1]
    if n > length:
        return audio[..., :length]
    if n < length:
        pad = [(0, 0)] * (audio.ndim - 1) + [(0, length - n)]
        return xp.pad(audio, pad)
    return audio


def stft_power(audio, *, n_fft: int = N_FFT, hop_length: int = HOP_LENGTH, xp=np):
    """|STFT|^2 of a centred, reflect-padded signal: [..., 1 + n_fft // 2, n_frames].

    Computed in float64 so that the log-mel matches float64 references to
    well below 1e-4 even for near-silent frames.
    """
    audio = xp.asarray(audio, dtype=xp.float64)
    pad = n_fft // 2
    lead = [(0, 0)] * (audio.ndim - 1)
    padded = xp.pad(audio, lead + [(pad, pad)], mode="reflect")
    n_frames = 1 + (padded.shape[-1] - n_fft) // hop_length
    idx = xp.arange(n_fft)[None, :] + hop_length * xp.arange(n_frames)[:, None]
    frames = padded[..., idx] * xp.asarray(hann_window(n_fft))          # [..., F, n_fft]
    spec = xp.fft.rfft(frames, axis=-1)                                  # [..., F, bins]
    power = spec.real ** 2 + spec.imag ** 2
    return xp.swapaxes(power, -1, -2)


def log_mel_spectrogram(audio, n_mels: int = 80, *, xp=np, pad_to: int | None = N_SAMPLES):
    """Whisper's log-mel features, float32 [n_mels, 3000] (or [B, n_mels, 3000] for a batch).

    ``audio`` is a 16 kHz waveform (numpy or cupy; 1-D or [B, samples]).
    ``pad_to=None`` keeps the natural length (frames = samples // 160).
    """
    audio = xp.asarray(audio, dtype=xp.float32)
    if pad_to is not None:
        audio = pad_or_trim(audio, pad_to, xp=xp)
    power = stft_power(audio, xp=xp)[..., :-1]                          # drop the last frame
    filters = xp.asarray(mel_filters(n_mels), dtype=xp.float64)
    mel = xp.matmul(filters, power)                                      # [..., n_mels, frames]
    log_spec = xp.log10(xp.maximum(mel, 1e-10))
    peak = log_spec.max(axis=(-2, -1), keepdims=True)                    # per utterance
    log_spec = xp.maximum(log_spec, peak - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(xp.float32)


def batch_features(waveforms, n_mels: int = 80, *, xp=np):
    """Stack per-utterance features into [B, n_mels, 3000] (each padded/trimmed to 30 s)."""
    batch = np.stack([pad_or_trim(np.asarray(w, dtype=np.float32)) for w in waveforms])
    return log_mel_spectrogram(xp.asarray(batch), n_mels, xp=xp)
