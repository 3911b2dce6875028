"""CTranslate2's ``model.bin``: read its variables into numpy, and write small ones (for tests).

The layout is the one CTranslate2's ``ModelSpec._serialize`` writes and its
C++ ``Model::load`` reads (all integers little-endian; a string is a uint16
length counting a trailing NUL, then the UTF-8 bytes and the NUL):

    uint32 binary_version
    string spec_name, uint32 spec_revision              (binary_version >= 2)
    uint32 n_variables, then per variable:
        string name, uint8 rank, uint32 dims[rank],
        uint8 dtype_id, uint32 n_bytes                  (binary_version >= 4;
        before: uint8 item_size, uint32 n_items)
        n_bytes of data, row-major
    uint32 n_aliases, then per alias: string alias, string target   (binary_version >= 3)

Variable names are scopes joined by "/" (``decoder/layer_0/attention/linear_1/weight``);
an alias names a variable stored once under another name (the tied output projection).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

# CTranslate2's DataType enum (include/ctranslate2/types.h); bfloat16 has no numpy dtype
# and is widened to float32 on reading.
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: "bfloat16"}
_DTYPE_IDS = {np.dtype(t): i for i, t in _DTYPES.items() if t != "bfloat16"}
_ITEM_SIZE_DTYPES = {4: np.float32, 2: np.int16, 1: np.int8}   # binary_version < 4
WRITTEN_BINARY_VERSION = 6


class Ct2FormatError(ValueError):
    """model.bin is truncated, of an unknown version, or holds something this reader cannot map."""


@dataclass
class Ct2Model:
    spec_name: str
    spec_revision: int
    binary_version: int
    variables: dict[str, np.ndarray]               # aliases resolved: the same array object
    aliases: dict[str, str] = field(default_factory=dict)

    def scalar(self, name: str, default=None):
        value = self.variables.get(name)
        return default if value is None else value.reshape(-1)[0].item()


class _Reader:
    def __init__(self, data):
        self.data, self.pos = memoryview(data), 0

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise Ct2FormatError(f"model.bin ends early (at byte {self.pos})")
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return values if len(values) > 1 else values[0]

    def string(self) -> str:
        n = self.take("<H")
        raw = bytes(self.data[self.pos:self.pos + n])
        self.pos += n
        return raw.rstrip(b"\0").decode("utf-8")

    def array(self, dtype, dims, n_bytes) -> np.ndarray:
        if self.pos + n_bytes > len(self.data):
            raise Ct2FormatError(f"model.bin ends early (at byte {self.pos})")
        raw = self.data[self.pos:self.pos + n_bytes]
        self.pos += n_bytes
        if dtype == "bfloat16":
            bits = np.frombuffer(raw, np.uint16).astype(np.uint32) << 16
            return bits.view(np.float32).reshape(dims)
        # A copy: the arrays outlive the buffer the file was read into.
        return np.frombuffer(raw, dtype).reshape(dims).copy()


def parse_ct2_model(data) -> Ct2Model:
    """Parse the bytes of a model.bin (bytes, bytearray, mmap)."""
    r = _Reader(data)
    version = r.take("<I")
    if not 2 <= version <= WRITTEN_BINARY_VERSION:
        raise Ct2FormatError(f"unsupported CTranslate2 binary version {version} "
                             f"(this reader knows 2 to {WRITTEN_BINARY_VERSION})")
    spec, revision = r.string(), r.take("<I")
    variables = {}
    for _ in range(r.take("<I")):
        name = r.string()
        dims = [r.take("<I") for _ in range(r.take("<B"))]
        if version >= 4:
            type_id, n_bytes = r.take("<B"), r.take("<I")
            if type_id not in _DTYPES:
                raise Ct2FormatError(f"{name}: unknown data type id {type_id}")
            dtype = _DTYPES[type_id]
        else:
            item_size, n_items = r.take("<B"), r.take("<I")
            dtype, n_bytes = _ITEM_SIZE_DTYPES[item_size], n_items * item_size
        variables[name] = r.array(dtype, dims, n_bytes)
    aliases = {}
    if version >= 3:
        for _ in range(r.take("<I")):
            alias, target = r.string(), r.string()
            aliases[alias] = target
    for alias, target in aliases.items():
        if target not in variables:
            raise Ct2FormatError(f"alias {alias} names a missing variable {target}")
        variables[alias] = variables[target]
    if r.pos != len(r.data):
        raise Ct2FormatError(f"{len(r.data) - r.pos} unread bytes after the aliases")
    return Ct2Model(spec, revision, version, variables, aliases)


def read_ct2_model(path) -> Ct2Model:
    with open(path, "rb") as f:
        return parse_ct2_model(f.read())


def float_variable(model: Ct2Model, name: str) -> np.ndarray:
    """A weight as float32, undoing int8/int16 quantization (``<name>_scale``) if present.

    CTranslate2 quantizes as ``round(w * scale)`` with one scale per output row
    (int8) or one for the tensor (int16).
    """
    value = model.variables[name].astype(np.float32)
    scale = model.variables.get(name + "_scale")
    if scale is not None:
        scale = scale.astype(np.float32)
        value = value / (scale.reshape(-1, *([1] * (value.ndim - 1))) if scale.ndim else scale)
    return value


def write_ct2_model(path, spec_name: str, spec_revision: int, variables: dict[str, np.ndarray],
                    aliases: dict[str, str] | None = None) -> None:
    """Write variables (float32/float16/int8/int16/int32 arrays) in the current binary version."""
    def string(s: str) -> bytes:
        raw = s.encode("utf-8")
        return struct.pack("<H", len(raw) + 1) + raw + b"\0"

    out = [struct.pack("<I", WRITTEN_BINARY_VERSION), string(spec_name), struct.pack("<I", spec_revision),
           struct.pack("<I", len(variables))]
    for name in sorted(variables):        # CTranslate2 writes variables in name order
        arr = np.ascontiguousarray(variables[name])
        out += [string(name), struct.pack("<B", arr.ndim), struct.pack(f"<{arr.ndim}I", *arr.shape),
                struct.pack("<B", _DTYPE_IDS[arr.dtype]), struct.pack("<I", arr.nbytes), arr.tobytes()]
    aliases = aliases or {}
    out.append(struct.pack("<I", len(aliases)))
    for alias, target in sorted(aliases.items()):
        out += [string(alias), string(target)]
    with open(path, "wb") as f:
        f.write(b"".join(out))
