"""Speculative ASR with a Whisper draft/target pair, scored by word error rate.

``WhisperSpeculativeDecoder`` is decoder.SpeculativeDecoder's loop with the
Whisper sessions of whisper_session.py plugged in where it expects decoder-only
sessions: per utterance, both encoders run once, then the loop decodes from
Whisper's forced prefix (start, language, task, no-timestamps).

With draft="ngram" there is no draft model: the same loop proposes by prompt lookup over the
decoder's tokens (forced prefix + generated so far, ngram.propose_ngram) and verifies one-hot drafts.
"""
from __future__ import annotations

import time
from pathlib import Path

from specsample_cupy.decode.decoder import SpeculativeDecoder
from specsample_cupy.decode.ngram import NGRAM, check_ngram_range
from specsample_cupy.runtime.model_folder import check_pair as check_tokenizers
from specsample_cupy.tasks.audio import AudioError, load_audio, log_mel_spectrogram
from specsample_cupy.tasks.datasets import NoUsableItems, Skipped, load_asr_items
from specsample_cupy.tasks.evaluation import (RunSettings, check_ngram_methods, draft_label, finish_report,
                                              item_record, progress_bar)
from specsample_cupy.tasks.instrumented import StepRecorder
from specsample_cupy.tasks.metrics import corpus_wer, normalizer_name
from specsample_cupy.tasks.whisper_config import check_pair
from specsample_cupy.tasks.whisper_session import WhisperDecoderSession, WhisperModel


class WhisperSpeculativeDecoder(StepRecorder, SpeculativeDecoder):
    """Speculative decoding for Whisper-style encoder-decoder exports (one utterance per call).

    Sets up what SpeculativeDecoder.generate() uses (sessions, specs, stream,
    tokenizer, context length) from two Whisper folders instead of two
    decoder-only folders; the decoding loop itself is SpeculativeDecoder's.
    draft="ngram": no draft model; the loop drafts by prompt lookup (self.draft is None,
    self.ngram the suffix lengths), as SpeculativeDecoder(draft="ngram") does.
    """

    def __init__(self, target, draft, device: str | None = None, *, language: str | None = "en",
                 task: str = "transcribe", device_id: int = 0, ngram_min: int = 1, ngram_max: int = 4):
        self.ngram = None
        if isinstance(draft, str) and draft == NGRAM:
            check_ngram_range(ngram_min, ngram_max)
            self.ngram = (ngram_min, ngram_max)
        self._use_device(device, device_id)
        kw = dict(device=self.device, language=language, task=task, stream=self.stream,
                  device_id=device_id)
        self.target_model = WhisperModel(target, **kw)
        self.target_spec = self.target_model.model_spec
        self.target = WhisperDecoderSession(self.target_model)
        self.draft_model = self.draft_spec = self.draft = None
        models = [self.target_model]
        if not self.ngram:
            self.draft_model = WhisperModel(draft, **kw)
            check_pair(self.target_model.spec, self.draft_model.spec)
            check_tokenizers(self.target_spec, self.draft_model.model_spec)
            self.draft_spec = self.draft_model.model_spec
            self.draft = WhisperDecoderSession(self.draft_model)
            models.append(self.draft_model)
        self.tokenizer = self.target_model.tokenizer
        self.context_length = min(m.spec.max_target_positions for m in models)
        self.prompt_ids = list(self.target_model.spec.prompt_ids)
        # The Whisper cache truncates on rollback, so no slack; the prompt is short.
        self.kv_slack, self.prefill_chunk = 0, self.context_length

    def features(self, audio, n_mels: int):
        """[1, n_mels, 3000] log-mel features on the decoding device."""
        return log_mel_spectrogram(self.xp.asarray(audio), n_mels, xp=self.xp)[None]

    def transcribe(self, audio, *, method: str = "exact", gamma: int = 5, max_new_tokens: int = 128,
                   temperature: float | None = None, seed: int = 0):
        """Decode one 16 kHz waveform; returns GenerationOutput with stats["encoder_s"] added."""
        start = time.perf_counter()
        with self._on_stream():
            feats = {}
            models = [(self.target_model, self.target)]
            if method != "target" and self.draft_model is not None:
                models.append((self.draft_model, self.draft))
            for model, session in models:
                n = model.spec.n_mels
                if n not in feats:
                    feats[n] = self.features(audio, n)
                session.set_encoder_output(model.encode(feats[n]))
        encoder_s = time.perf_counter() - start
        out = self.generate([self.prompt_ids], max_new_tokens=max_new_tokens, gamma=gamma,
                            method=method, temperature=temperature, seed=seed)
        out.texts = [t.strip() for t in out.texts]
        out.stats["encoder_s"] = encoder_s
        return out


def run_asr(target, draft, data, settings: RunSettings, *, device=None, limit=None, language="en",
            task="transcribe", json_path=None, plot_path=None, echo=print, ngram_min=1, ngram_max=4) -> dict:
    """Evaluate every method on the data; print the table; write JSON/plot; return the report.
    draft="ngram": prompt-lookup drafts over ngram_min..ngram_max tokens instead of a draft model."""
    settings.check()
    if draft == NGRAM:
        check_ngram_methods(settings.methods)
    items, skipped = load_asr_items(data)
    if not items:
        raise NoUsableItems(data, "utterances", skipped)
    decoder = WhisperSpeculativeDecoder(target, draft, device, language=language, task=task,
                                        ngram_min=ngram_min, ngram_max=ngram_max)
    methods = settings.methods
    records = {m: [] for m in methods}

    def decode(audio, method, max_new):
        return decoder.transcribe(audio, method=method, gamma=settings.gamma, max_new_tokens=max_new,
                                  temperature=settings.temperature_for(method), seed=settings.seed)

    warmed = not settings.warmup
    planned = len(items) if limit is None else min(limit, len(items))
    bar = progress_bar(planned * len(methods), settings.progress, "asr")
    for item in items:
        if limit is not None and len(records[methods[0]]) >= limit:
            break                                      # --limit counts usable items only
        try:
            audio = load_audio(item.audio)
        except AudioError as exc:
            skipped.append(Skipped(item.id, item.source, str(exc)))
            bar.update(len(methods))
            continue
        if not warmed:
            # First calls compile kernels and size ORT's buffers: keep that out of the timings.
            for m in methods:
                decode(audio, m, min(8, settings.max_new_tokens))
            warmed = True
        for m in methods:
            start = time.perf_counter()
            out = decode(audio, m, settings.max_new_tokens)
            records[m].append(item_record(item.id, out, time.perf_counter() - start,
                                          reference=item.text, hypothesis=out.texts[0],
                                          audio=str(item.audio), encoder_s=out.stats["encoder_s"]))
            bar.update(1)
    bar.close()
    if not records[methods[0]]:                       # every utterance's audio was unreadable
        raise NoUsableItems(data, "utterances", skipped)

    accuracy = {}
    for m in methods:
        scores = corpus_wer([r["reference"] for r in records[m]], [r["hypothesis"] for r in records[m]])
        for r, p in zip(records[m], scores["per_item"]):
            r["wer"] = p["wer"]
        accuracy[m] = scores
    header = {"target": str(Path(target)), "draft": draft_label(draft, decoder.ngram), "data": str(Path(data)),
              "device": decoder.device, "methods": methods, "gamma": settings.gamma,
              "max_new_tokens": settings.max_new_tokens, "temperature": settings.temperature,
              "seed": settings.seed, "language": language, "task_name": task,
              "prompt_ids": decoder.prompt_ids, "items_evaluated": len(records[methods[0]]),
              "normalizer": normalizer_name()}
    report = finish_report("asr", header, records, accuracy, skipped, json_path=json_path,
                           plot_path=plot_path, echo=echo)
    # WERs are only comparable under the same normaliser: say which one these are.
    echo(f"WER on texts normalised by {header['normalizer']}")
    return report
