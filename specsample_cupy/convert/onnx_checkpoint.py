"""An ONNX export of a Hugging Face model (optimum's `text-generation-with-past`, torch.onnx underneath)
read as a checkpoint, so that the converter can write it again in the project's format.

torch.onnx keeps the parameter names of the tensors a module reads directly (embeddings, norms, biases)
but folds each Linear weight into an initializer with an opaque name (onnx::MatMul_8754), stored
transposed ([in, out]) for its MatMul. The node that reads it is named after the module that made it
(/model/layers.0/self_attn/q_proj/MatMul), so the weight's Hugging Face name is the node's path plus
".weight", and its values are the initializer transposed back. Gemm nodes (2-D inputs) keep the weight
as Linear stores it when transB is set.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from specsample_cupy.convert.checkpoint import ConversionError, TensorFolder

ONNX_FILES = ("model.onnx", "decoder_model_merged.onnx", "decoder_with_past_model.onnx")
_LINEAR_NODE = re.compile(r"/(.+)/(MatMul|Gemm)(_\d+)?")
_PARAMETER = re.compile(r"(model|lm_head|transformer)\.[\w.]+")


def onnx_file(folder: Path) -> Path | None:
    """The export's decoder file in `folder`, or None."""
    return next((folder / name for name in ONNX_FILES if (folder / name).exists()), None)


def _nodes(graph):
    """Every node of the graph and of its subgraphs (optimum's merged decoder keeps its two branches in
    an If node; their weights are the main graph's initializers)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.g is not None and attr.g.node:
                yield from _nodes(attr.g)


def _hf_name(node) -> str | None:
    m = _LINEAR_NODE.fullmatch(node.name)
    if m is None:
        return None
    path = re.sub(r"^(model/)+", "model/", m.group(1))   # some exports nest the wrapper's "model" twice
    return path.replace("/", ".") + ".weight"


class OnnxCheckpoint(TensorFolder):
    """config.json and the export's tensors under their Hugging Face names (module docstring)."""

    def __init__(self, folder):
        import onnx

        super().__init__(folder)
        path = onnx_file(self.folder)
        if path is None:
            raise ConversionError(f"{self.folder} has no {' / '.join(ONNX_FILES)}")
        model = onnx.load(str(path), load_external_data=False)
        self._inits = {t.name: t for t in model.graph.initializer}
        # self._where: Hugging Face name -> (initializer, transposed?)
        for name in self._inits:
            if _PARAMETER.fullmatch(name):
                self._where[name] = (name, False)
        for node in _nodes(model.graph):
            if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2 or node.input[1] not in self._inits:
                continue
            hf = _hf_name(node)
            if hf is None or hf in self._where:
                continue
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            self._where[hf] = (node.input[1], not (node.op_type == "Gemm" and trans_b))

    def get(self, name: str) -> np.ndarray:
        from onnx import numpy_helper

        where = self._where.get(name)
        if where is None:
            raise ConversionError(f"{self.folder}: the export has no tensor for {name!r}")
        init, transposed = where
        array = numpy_helper.to_array(self._inits[init], base_dir=str(self.folder))
        return np.ascontiguousarray(array.T) if transposed else array
