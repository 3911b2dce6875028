"""ONNX Runtime GenAI builder graphs on fixed bindings: the one change that lets the device loop feed them.

The builder's decoders (onnxruntime_genai.models.builder) use com.microsoft.GroupQueryAttention, like
convert(attention="gqa"), and derive its two length inputs from attention_mask inside the graph:
seqlens_k from the mask's row sums (on the GPU: what the device loop's count contract needs as it
is), total_sequence_length from the mask's width (Shape, Gather, Cast: host-side shape arithmetic).
With the cache bound at a fixed capacity C the mask is [B, C + S] wide, which would make the present
C + S long; the device loop binds past and present to one buffer of C. So the graph is rewritten to
take total_sequence_length as an input (the capacity, sessions_static), its shape arithmetic pruned,
into a cache folder (layout.derived_folder: written once per source file, said once on stderr). Its
weights stay where they are: the session loads the rewritten graph with the source folder as the
place of its external data (ONNX Runtime refuses external data that resolves outside the model's own
folder, so links into the source folder would not load).
"""
from __future__ import annotations

import sys
from pathlib import Path

from specsample_cupy.runtime.genai_config import GENAI_CONFIG

TOTAL = "total_sequence_length"
GQA = "GroupQueryAttention"


def _needs_rewrite(graph) -> str | None:
    """The tensor every GroupQueryAttention takes as its total length, when it is computed in the graph
    (not an input); None when the graph has no GroupQueryAttention or already takes the input."""
    inputs = {i.name for i in graph.input}
    totals = {n.input[6] for n in graph.node if n.op_type == GQA and len(n.input) > 6}
    if not totals or totals <= inputs:
        return None
    if len(totals) > 1:
        raise ValueError(f"GroupQueryAttention nodes take different total lengths: {sorted(totals)}")
    return totals.pop()


def _prune(graph) -> None:
    """Drop nodes none of whose outputs is read (by a node or as a graph output), until none is left."""
    while True:
        read = {name for n in graph.node for name in n.input} | {o.name for o in graph.output}
        dead = [n for n in graph.node if not any(o in read for o in n.output if o)]
        if not dead:
            return
        for n in dead:
            graph.node.remove(n)


def rewrite(model) -> bool:
    """In place: GroupQueryAttention's total length from a new int32 [1] input; False when nothing to do."""
    from onnx import TensorProto, helper

    total = _needs_rewrite(model.graph)
    if total is None:
        return False
    for node in model.graph.node:
        if node.op_type == GQA and len(node.input) > 6 and node.input[6] == total:
            node.input[6] = TOTAL
    model.graph.input.append(helper.make_tensor_value_info(TOTAL, TensorProto.INT32, [1]))
    _prune(model.graph)
    return True


def for_fixed_bindings(onnx_path, cache_root: Path | None = None) -> tuple[Path, Path | None]:
    """(model file, folder of its external data): (onnx_path, None) for a graph that needs no change,
    or the rewritten copy of a builder graph (module docstring) in the cache and onnx_path's folder.
    Only a builder folder (genai_config.json beside the model) is read at all."""
    import onnx

    from specsample_cupy.runtime.layout import derived_folder

    onnx_path = Path(onnx_path)
    if not (onnx_path.parent / GENAI_CONFIG).exists():
        return onnx_path, None
    folder = derived_folder("graphs", onnx_path)
    if cache_root is not None:
        folder = Path(cache_root) / folder.name
    out = folder / onnx_path.name
    if out.exists():   # rewritten before (the key follows the source file): no need to read it again
        return out, onnx_path.parent
    model = onnx.load(str(onnx_path), load_external_data=False)
    if _needs_rewrite(model.graph) is None:
        return onnx_path, None
    rewrite(model)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (onnx_path.name + ".tmp")
    onnx.save_model(model, str(tmp))
    tmp.replace(out)
    print(f"{onnx_path}: GroupQueryAttention's total length made an input for fixed bindings, in {out}",
          file=sys.stderr)
    return out, onnx_path.parent
