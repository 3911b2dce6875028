"""Writing decoder graphs with the onnx helpers: node naming, weights (inline or in one external file),
and the attention mask every exported decoder shares.

The decoders this project writes have no shape arithmetic (no Shape, Range or ConstantOfShape nodes):
ONNX Runtime places such nodes on the CPU, and a CUDA session with a CPU node cannot capture a run as
a CUDA graph. Everything shape-dependent is derived from running sums over ones shaped like the inputs.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

MS_DOMAIN = "com.microsoft"
EXTERNAL_ALIGN = 4096          # external tensors start on page boundaries (mmap-friendly)
INLINE_LIMIT = 1 << 30         # weights above this many bytes in all go to an external file (protobuf: 2 GB)

_ONNX_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16}


def onnx_type(dtype) -> int:
    return _ONNX_TYPES[np.dtype(dtype)]


class ExternalData:
    """Appends tensors to one file beside the model and returns TensorProtos that point into it, so a
    multi-GB model is written tensor by tensor and never held twice in memory."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.f = open(self.path, "wb")

    def tensor(self, array: np.ndarray, name: str) -> TensorProto:
        array = np.ascontiguousarray(array)
        self.f.seek(-self.f.tell() % EXTERNAL_ALIGN, os.SEEK_CUR)
        offset = self.f.tell()
        self.f.write(array.tobytes())
        t = TensorProto(name=name, data_type=onnx_type(array.dtype), dims=array.shape,
                        data_location=TensorProto.EXTERNAL)
        for key, value in (("location", self.path.name), ("offset", offset), ("length", array.nbytes)):
            t.external_data.add(key=key, value=str(value))
        return t

    def close(self):
        self.f.close()


class GraphBuilder:
    """Names nodes and collects nodes and initializers.

    weight_dtype: how weights are stored. compute_dtype: what weight() returns; when it differs from
    weight_dtype (fp16 weights of an fp32 graph) a Cast node is added, which ONNX Runtime folds when
    the session is created. external: an ExternalData that takes every weight (None: inline)."""

    def __init__(self, weight_dtype, compute_dtype=np.float32, external: ExternalData | None = None):
        self.nodes, self.inits, self._n = [], [], 0
        self.weight_dtype = np.dtype(weight_dtype)
        self.compute_dtype = np.dtype(compute_dtype)
        self.external = external

    def _name(self, hint):
        self._n += 1
        return f"{hint}_{self._n}"

    def op(self, op_type, inputs, hint=None, outputs=None, domain=None, **attrs):
        outs = outputs or [self._name(hint or op_type.lower())]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self._name("n_" + op_type),
                                           domain=domain, **attrs))
        return outs[0]

    def const(self, array, hint="const"):
        name = self._name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def scalar(self, value, hint="const"):
        """A scalar of the compute dtype."""
        return self.const(np.asarray(value, self.compute_dtype), hint)

    def weight(self, array, name):
        """Stored in weight_dtype, returned as a tensor name of compute_dtype."""
        stored = np.ascontiguousarray(array, dtype=self.weight_dtype)
        if self.external is not None:
            self.inits.append(self.external.tensor(stored, name))
        else:
            self.inits.append(numpy_helper.from_array(stored, name))
        if self.weight_dtype == self.compute_dtype:
            return name
        return self.op("Cast", [name], hint=name + "_cast", to=onnx_type(self.compute_dtype))

    def linear(self, x, w, b):
        return self.op("Add", [self.op("MatMul", [x, w]), b])


def attention_allowed(g: GraphBuilder, input_ids: str, attention_mask: str) -> str:
    """Bool [batch, 1, seq, past+seq]: key j visible to new token t.

    Visible iff attention_mask[b, j] != 0 and j <= past + t (causality among the new tokens; every
    past slot precedes all new tokens). Column indices come from running sums over ones shaped like
    the inputs, not from Shape/Range nodes (see the module docstring). Indices are float32 (exact
    below 2**24).
    """
    f32 = TensorProto.FLOAT
    zero, one = g.const(np.float32(0.0)), g.const(np.float32(1.0))
    axis1 = g.const(np.array(1, np.int64))
    ones_k = g.op("Add", [g.op("Mul", [g.op("Cast", [attention_mask], to=f32), zero]), one])  # [B,T]
    ones_q = g.op("Add", [g.op("Mul", [g.op("Cast", [input_ids], to=f32), zero]), one])       # [B,S]
    key_idx = g.op("Sub", [g.op("CumSum", [ones_k, axis1]), one])                           # 0..T-1
    axes1 = g.const(np.array([1], np.int64))
    past = g.op("Sub", [g.op("ReduceSum", [ones_k, axes1], keepdims=1),
                        g.op("ReduceSum", [ones_q, axes1], keepdims=1)])                    # [B,1]
    q_idx = g.op("Add", [g.op("Sub", [g.op("CumSum", [ones_q, axis1]), one]), past])        # past..T-1
    causal = g.op("LessOrEqual", [g.op("Unsqueeze", [key_idx, axes1]),                       # [B,1,T]
                                  g.op("Unsqueeze", [q_idx, g.const(np.array([2], np.int64))])])  # [B,S,1]
    mask_bool = g.op("Cast", [attention_mask], to=TensorProto.BOOL)                          # [B,T]
    mask3 = g.op("Unsqueeze", [mask_bool, axes1])                                            # [B,1,T]
    allowed = g.op("And", [mask3, causal])                                                   # [B,S,T]
    return g.op("Unsqueeze", [allowed, axes1], hint="attn_allowed")                          # [B,1,S,T]
