"""ONNX exports converted once, on first load, into a cache folder: the decoder's fallback on CUDA when
ONNX Runtime cannot capture an export's runs as CUDA graphs (its shape arithmetic runs on the CPU), and,
when a decoder is opened for batches, the layout that batches for an ONNX Runtime GenAI builder folder
(which decodes one prompt per call as it comes: decode/one_at_a_time.py).

The copy is the converter's output (convert()) from the export's own weights (onnx_checkpoint.py), in
the export's dtype, keyed by the export file's path, size and modification time (layout.derived_folder):
a changed export is converted again. Said once on stderr, when the copy is written.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from specsample_cupy.convert.families import FAMILIES


def convertible(folder) -> bool:
    """Whether `folder` is an ONNX export (no safetensors) of an architecture the converter writes."""
    from specsample_cupy.convert.checkpoint import ConversionError, read_json
    from specsample_cupy.convert.onnx_checkpoint import onnx_file

    folder = Path(folder)
    if onnx_file(folder) is None or (folder / "model.safetensors").exists():
        return False
    try:
        architectures = read_json(folder / "config.json").get("architectures") or [None]
    except ConversionError:
        return False
    return architectures[0] in FAMILIES


def _export_dtype(path: Path) -> str:
    """"float16" for an export whose logits are float16, or (no logits output typed) whose weights are
    mostly float16 by element count; else "float32"."""
    import math

    import onnx
    from onnx import TensorProto

    graph = onnx.load(str(path), load_external_data=False).graph
    logits = next((o for o in graph.output if o.name == "logits"), None)
    elem = logits.type.tensor_type.elem_type if logits is not None else TensorProto.UNDEFINED
    if elem == TensorProto.UNDEFINED:
        counts = {TensorProto.FLOAT16: 0, TensorProto.FLOAT: 0}
        for t in graph.initializer:
            if t.data_type in counts:
                counts[t.data_type] += math.prod(t.dims)
        elem = max(counts, key=counts.get)
    return "float16" if elem == TensorProto.FLOAT16 else "float32"


def _source_file(folder: Path) -> Path | None:
    """The export's decoder file: a builder folder's as genai_config.json names it, else optimum's."""
    from specsample_cupy.convert.builder_checkpoint import is_builder_folder
    from specsample_cupy.convert.onnx_checkpoint import onnx_file
    from specsample_cupy.runtime.genai_config import GENAI_CONFIG, config_from_genai

    if is_builder_folder(folder):
        path = folder / GENAI_CONFIG
        _, filename = config_from_genai(json.loads(path.read_text()), path)
        return folder / (filename or "model.onnx")
    return onnx_file(folder)


def converted_copy(folder, root: Path | None = None) -> Path:
    """The cached conversion of the export in `folder` (module docstring); ConversionError when the
    converter cannot read it."""
    from specsample_cupy.convert import FORMAT_VERSION, convert
    from specsample_cupy.runtime.layout import derived_folder

    folder = Path(folder)
    source = _source_file(folder)
    out = derived_folder("converted", source, FORMAT_VERSION)
    if root is not None:
        out = Path(root) / out.name
    if (out / "config.json").exists():
        return out
    dtype = _export_dtype(source)
    convert(folder, out, dtype=dtype, overwrite=True)
    print(f"{folder}: converted once into {out} ({dtype}), a layout that batches and runs with CUDA graphs",
          file=sys.stderr)
    return out


def batching_folder(folder, root: Path | None = None) -> tuple[Path, str | None]:
    """(the folder a decoder opened for batches loads, why not converted): for an ONNX Runtime GenAI
    builder folder (whose graph decodes one prompt per call) its conversion (converted_copy) and None;
    for a builder folder the converter refuses, the folder and the refusal's line (it then decodes as
    it comes, a batch prompt by prompt); any other folder as it is, and None."""
    from specsample_cupy.convert.builder_checkpoint import is_builder_folder

    folder = Path(folder)
    if not is_builder_folder(folder):
        return folder, None
    try:
        return converted_copy(folder, root), None
    except (ValueError, OSError) as e:   # ConversionError is a ValueError
        return folder, (f"{folder}: its conversion for batches failed ({str(e).splitlines()[0][:300]}); "
                        "it decodes as it comes, a batch one prompt per call")
