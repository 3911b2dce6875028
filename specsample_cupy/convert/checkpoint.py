"""A Hugging Face checkpoint folder read without torch: config.json, the safetensors weights (one file,
or shards listed by model.safetensors.index.json), tokenizer and generation config.

Tensors are read lazily through the safetensors library's NumPy API; bfloat16 shards come back as
ml_dtypes.bfloat16 arrays (NumPy has no bfloat16 of its own), which convert to float32 exactly.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


class ConversionError(ValueError):
    """A checkpoint the converter cannot (or will not) convert; the message is one line naming why."""


def read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConversionError(f"{path}: cannot read it as JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise ConversionError(f"{path}: expected a JSON object")
    return value


class TensorFolder:
    """A folder of named tensors with a Hugging Face config.json: config (dict), names(), has(name),
    get(name) -> np.ndarray in the stored dtype (subclasses: their _where maps each name to where the
    tensor is), get_float(), side_file(), and the rotary embedding's frequencies and tables."""

    def __init__(self, folder):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise ConversionError(f"{self.folder} is not a folder")
        config_path = self.folder / "config.json"
        if not config_path.exists():
            raise ConversionError(f"{self.folder} has no config.json (not a Hugging Face checkpoint folder)")
        self.config = read_json(config_path)
        self._where: dict = {}

    def names(self) -> set[str]:
        return set(self._where)

    def has(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> np.ndarray:
        raise NotImplementedError

    def get_float(self, name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
        """The tensor as `dtype` (float16/float32), checked against `shape`."""
        t = self.get(name)
        if tuple(t.shape) != tuple(shape):
            raise ConversionError(f"{self.folder}: {name} has shape {tuple(t.shape)}, the config implies {shape}")
        if t.dtype.kind not in "fV" and t.dtype.name != "bfloat16":
            raise ConversionError(f"{self.folder}: {name} is {t.dtype}, not a float tensor")
        if t.dtype == np.dtype(dtype):
            return t
        return t.astype(np.float32).astype(dtype)   # via float32: exact for bfloat16 and float16

    def side_file(self, name: str) -> Path | None:
        path = self.folder / name
        return path if path.exists() else None

    def inv_freq(self, shape) -> tuple:
        """The rotary inverse frequencies: the config's (families.llama_shape), unless the folder holds
        its own tables (builder_checkpoint.py)."""
        return shape.inv_freq

    def rotary_tables(self, shape, dtype) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin [context, head_dim / 2] that the converted graph rotates by."""
        return shape.rotary_tables(dtype)


class Checkpoint(TensorFolder):
    """A safetensors checkpoint (module docstring)."""

    def __init__(self, folder):
        import ml_dtypes  # noqa: F401 - registers bfloat16 with NumPy, which safetensors then returns
        from safetensors import safe_open

        super().__init__(folder)
        for shard in self._shards():
            with safe_open(str(shard), framework="numpy") as f:
                for name in f.keys():
                    self._where[name] = shard
        self._open = {}
        self._safe_open = safe_open

    def _shards(self) -> list[Path]:
        index = self.folder / "model.safetensors.index.json"
        if index.exists():
            weight_map = read_json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ConversionError(f"{index} has no weight_map")
            shards = sorted({self.folder / f for f in weight_map.values()})
            missing = [s.name for s in shards if not s.exists()]
            if missing:
                raise ConversionError(f"{self.folder} lacks the shard {missing[0]} that {index.name} lists")
            return shards
        single = self.folder / "model.safetensors"
        if single.exists():
            return [single]
        if any(self.folder.glob("*.bin")) or any(self.folder.glob("*.pt")):
            raise ConversionError(f"{self.folder} holds PyTorch pickles, not safetensors; save the model with "
                                  "save_pretrained(..., safe_serialization=True)")
        raise ConversionError(f"{self.folder} has neither model.safetensors nor model.safetensors.index.json")

    def get(self, name: str) -> np.ndarray:
        shard = self._where.get(name)
        if shard is None:
            raise ConversionError(f"{self.folder}: the checkpoint lacks the tensor {name!r}")
        f = self._open.get(shard)
        if f is None:
            f = self._open[shard] = self._safe_open(str(shard), framework="numpy").__enter__()
        return f.get_tensor(name)
