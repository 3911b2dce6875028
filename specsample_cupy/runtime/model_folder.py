"""A model folder as the decoders read it: the ONNX file (model.onnx, or optimum's merged and
with-past decoders), config.json (or ONNX Runtime GenAI's genai_config.json), tokenizer.json and
generation_config.json: ModelSpec, and check_pair() for a draft and target that must share a tokenizer."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specsample_cupy.runtime.genai_config import GENAI_CONFIG, config_from_genai

MODEL_FILES = ("model.onnx", "decoder_model_merged.onnx", "decoder_with_past_model.onnx")
CONTEXT_KEYS = ("n_positions", "max_position_embeddings", "n_ctx")


def _read_json(path: Path) -> dict:
    """The JSON object in `path`, or {} when there is no such file. Anything else wrong with the file
    raises ValueError in one line that names it: the CLI prints that line, never a traceback."""
    if not path.exists():
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from exc
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _ids(value, path: Path, key: str) -> tuple[int, ...]:
    """A config's token id field (None, an int or a list of ints) as a tuple; ValueError naming the file
    and key for anything else (a float or a string id would index the vocabulary wrongly later)."""
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ValueError(f"{path}: {key} must be a token id or a list of token ids, got {value!r}")
    return tuple(values)


def _positive_int(config: dict, key: str, path: Path) -> int:
    value = config[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{path}: {key} must be a positive integer, got {value!r}")
    return value


def _load_tokenizer(path: Path):
    """tokenizers.Tokenizer from tokenizer.json. The tokenizers library raises a plain Exception (exactly
    that class) for every parse or read error, so exactly that class is turned into ValueError naming the
    file; its subclasses (MemoryError, ...) are not about the file and propagate."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:   # noqa: BLE001 - narrowed to the exact class just below
        if type(exc) is not Exception:
            raise
        detail = (str(exc).splitlines() or ["unreadable"])[0]
        raise ValueError(f"{path}: not a valid tokenizers file ({detail})") from exc


@dataclass
class ModelSpec:
    """What a model directory declares: the ONNX file, config, tokenizer and special token ids."""
    model_dir: Path
    onnx_path: Path
    config: dict
    vocab_size: int
    context_length: int | None   # n_positions / max_position_embeddings; None if the config has none
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    pad_token_id: int
    tokenizer: object            # tokenizers.Tokenizer
    config_path: Path | None = None   # where config came from (config.json or genai_config.json)

    @classmethod
    def from_dir(cls, model_dir) -> "ModelSpec":
        """Read and check a model directory. Raises ValueError, one line naming the file and what is
        wrong, for a missing or unusable file (the ONNX file itself is checked when a session opens it)."""
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise ValueError(f"model directory {model_dir} does not exist")
        config_path = model_dir / "config.json"
        genai_path = model_dir / GENAI_CONFIG
        genai_file = None
        if not config_path.exists() and genai_path.exists():   # ONNX Runtime GenAI's builder folder
            config, genai_file = config_from_genai(_read_json(genai_path), genai_path)
            config_path = genai_path
        names = ((genai_file,) if genai_file else ()) + MODEL_FILES
        onnx_path = next((model_dir / n for n in names if (model_dir / n).exists()), None)
        if onnx_path is None:
            if (model_dir / "decoder_model.onnx").exists():
                raise ValueError(f"{model_dir} holds only decoder_model.onnx, a decoder without past; "
                                 "export with the task text-generation-with-past")
            raise ValueError(f"{model_dir} has none of {', '.join(MODEL_FILES)}")
        if not config_path.exists():
            raise ValueError(f"{model_dir} has no config.json (nor an ONNX Runtime GenAI genai_config.json)")
        if config_path.name == "config.json":
            config = _read_json(config_path)
        if "vocab_size" not in config:
            raise ValueError(f"{config_path} lacks vocab_size")
        vocab_size = _positive_int(config, "vocab_size", config_path)
        context = next((_positive_int(config, k, config_path) for k in CONTEXT_KEYS if config.get(k)), None)
        tokenizer_path = model_dir / "tokenizer.json"
        if not tokenizer_path.exists():
            raise ValueError(f"{model_dir} has no tokenizer.json")
        generation_path = model_dir / "generation_config.json"
        generation = _read_json(generation_path)
        special = {}
        for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
            source = generation_path if key in generation else config_path
            special[key] = _ids(generation.get(key, config.get(key)), source, key)
        eos, bos = special["eos_token_id"], special["bos_token_id"]
        pad = special["pad_token_id"] or eos or (0,)
        return cls(model_dir, onnx_path, config, vocab_size, context, eos, bos[0] if bos else None, pad[0],
                   _load_tokenizer(tokenizer_path), config_path)

    def encode(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text).ids
        if not ids:
            # An empty prompt still needs one token to condition on; start from BOS (or EOS, as GPT-2 does).
            start = self.bos_token_id if self.bos_token_id is not None else (self.eos_token_ids or (None,))[0]
            if start is None:
                raise ValueError("empty prompt and the model declares no bos/eos token to start from")
            ids = [start]
        return ids


def check_pair(target: ModelSpec, draft: ModelSpec):
    """Raise ValueError unless the draft can propose tokens for the target: same vocabulary and tokenizer."""
    if target.vocab_size != draft.vocab_size:
        raise ValueError(f"vocab sizes differ: target {target.model_dir} has {target.vocab_size}, "
                         f"draft {draft.model_dir} has {draft.vocab_size}")
    t_vocab = target.tokenizer.get_vocab(with_added_tokens=True)
    d_vocab = draft.tokenizer.get_vocab(with_added_tokens=True)
    if t_vocab != d_vocab:
        differing = sorted(set(t_vocab.items()) ^ set(d_vocab.items()), key=lambda kv: kv[1])[:3]
        raise ValueError(f"tokenizers differ between target {target.model_dir} and draft {draft.model_dir} "
                         f"(e.g. token/id pairs {differing} are in only one of them)")
