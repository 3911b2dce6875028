"""What a Whisper export's JSON files say: mel bins, decoder prompt, special and suppressed tokens.

Reads config.json, generation_config.json, preprocessor_config.json and
tokenizer.json of an ``optimum-cli export onnx --task
automatic-speech-recognition-with-past`` folder (or of the tiny test models).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from specsample_cupy.tasks.datasets import DataError


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from exc


@dataclass
class WhisperSpec:
    model_dir: Path
    n_mels: int
    prompt_ids: list[int]               # <|startoftranscript|> [<|lang|>] [<|task|>] <|notimestamps|>
    eos_token_id: int
    suppress_tokens: list[int] = field(default_factory=list)        # at every step
    begin_suppress_tokens: list[int] = field(default_factory=list)  # at the first generated token
    max_target_positions: int = 448
    vocab_size: int | None = None


def _token_id(tokenizer, token: str) -> int | None:
    return tokenizer.token_to_id(token) if tokenizer is not None else None


def _language_token(language: str) -> str:
    lang = language.strip().lower()
    return lang if lang.startswith("<|") else f"<|{lang}|>"


def whisper_prompt(generation: dict, config: dict, tokenizer, *, language: str | None = "en",
                   task: str = "transcribe") -> list[int]:
    """The forced decoder prefix, from generation_config.json like transformers' generate().

    Multilingual models get start, language, task and no-timestamps tokens;
    English-only models (no ``lang_to_id``) get start and no-timestamps.
    ``language=None`` keeps whatever forced_decoder_ids says (for a language
    left open there, English is assumed: the models are run without language
    detection).
    """
    start = generation.get("decoder_start_token_id", config.get("decoder_start_token_id"))
    if start is None:
        start = _token_id(tokenizer, "<|startoftranscript|>")
    if start is None:
        raise DataError("cannot find the decoder start token (decoder_start_token_id or "
                        "<|startoftranscript|> in the tokenizer)")
    ids = [int(start)]
    lang_to_id = generation.get("lang_to_id") or {}
    task_to_id = generation.get("task_to_id") or {}
    forced = sorted((p, t) for p, t in (generation.get("forced_decoder_ids") or []))
    multilingual = bool(lang_to_id) or bool(generation.get("is_multilingual"))
    if multilingual:
        lang_tok = _language_token(language or "en")
        lang_id = lang_to_id.get(lang_tok, _token_id(tokenizer, lang_tok))
        if lang_id is None:
            raise DataError(f"language {language!r} is not known to the model "
                            f"(known: {', '.join(sorted(lang_to_id)) or 'none'})")
        task_id = task_to_id.get(task, _token_id(tokenizer, f"<|{task}|>"))
        if task_id is None:
            raise DataError(f"task {task!r} is not known to the model")
        ids += [int(lang_id), int(task_id)]
    else:
        # English-only exports force just <|notimestamps|> (position 1).
        ids += [int(t) for _, t in forced if t is not None]
    no_ts = generation.get("no_timestamps_token_id", _token_id(tokenizer, "<|notimestamps|>"))
    if no_ts is not None and int(no_ts) not in ids:
        ids.append(int(no_ts))
    return ids


def load_whisper_spec(model_dir, *, language: str | None = "en", task: str = "transcribe",
                      tokenizer=None) -> WhisperSpec:
    model_dir = Path(model_dir)
    config = _read_json(model_dir / "config.json")
    generation = _read_json(model_dir / "generation_config.json")
    preprocessor = _read_json(model_dir / "preprocessor_config.json")
    n_mels = preprocessor.get("feature_size") or config.get("num_mel_bins")
    if n_mels is None:
        raise DataError(f"{model_dir}: neither preprocessor_config.json 'feature_size' nor "
                        "config.json 'num_mel_bins' gives the number of mel bins")
    eos = generation.get("eos_token_id", config.get("eos_token_id"))
    if isinstance(eos, list):
        eos = eos[0]
    if eos is None:
        eos = _token_id(tokenizer, "<|endoftext|>")
    if eos is None:
        raise DataError(f"{model_dir}: no eos_token_id")
    return WhisperSpec(
        model_dir=model_dir, n_mels=int(n_mels),
        prompt_ids=whisper_prompt(generation, config, tokenizer, language=language, task=task),
        eos_token_id=int(eos),
        suppress_tokens=[int(t) for t in generation.get("suppress_tokens") or []],
        begin_suppress_tokens=[int(t) for t in generation.get("begin_suppress_tokens") or []],
        max_target_positions=int(config.get("max_target_positions", 448)),
        vocab_size=config.get("vocab_size"))


def check_pair(target: WhisperSpec, draft: WhisperSpec) -> None:
    """Draft and target must agree on everything the shared loop relies on."""
    problems = []
    if target.prompt_ids != draft.prompt_ids:
        problems.append(f"decoder prompts differ ({target.prompt_ids} vs {draft.prompt_ids})")
    if target.eos_token_id != draft.eos_token_id:
        problems.append("end-of-text ids differ")
    if target.vocab_size and draft.vocab_size and target.vocab_size != draft.vocab_size:
        problems.append(f"vocabulary sizes differ ({target.vocab_size} vs {draft.vocab_size})")
    if problems:
        raise DataError("draft and target do not share a tokenizer: " + "; ".join(problems))
