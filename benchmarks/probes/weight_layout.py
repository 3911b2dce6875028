"""How a converted graph stores its weight matrices, on CUDA at a real shape: as MatMul's [in, out]
(the converter's layout) against the checkpoint's own [out, in] read by FusedMatMul with transB (the
layout the LM head already uses), in the GroupQueryAttention layout. At batch 1 each product is a
matrix-vector product of a 5-28 MB matrix, and which cuBLAS kernel runs it depends on the layout.
Device ms of one captured run, the two variants' sessions alive together and timed in alternation
(ABAB, `--rounds` times, medians of `--reps` runs each), with the weight-read floor beside them.

    python benchmarks/probes/weight_layout.py --work /tmp/gqa [--shape qwen2.5-1.5b] [--json F]

--work is shared with gqa_layout.py (its checkpoint and converted folders are reused).
"""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np


def _sibling(name):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def transposed_copy(src: Path, dst: Path) -> int:
    """dst: src's model with every MatMul on a 2-D initializer [in, out] rewritten as FusedMatMul
    (transB) on that initializer transposed to [out, in]. Returns the number rewritten."""
    import onnx
    from onnx import helper, numpy_helper

    if (dst / "model.onnx").exists():
        return -1
    model = onnx.load(str(src / "model.onnx"))
    inits = {t.name: t for t in model.graph.initializer}
    casts = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Cast"}
    rewritten = 0
    for k, node in enumerate(model.graph.node):
        if node.op_type != "MatMul":
            continue
        name = casts.get(node.input[1], node.input[1])
        if name not in inits or len(inits[name].dims) != 2:
            continue
        array = numpy_helper.to_array(inits[name])
        inits[name].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(array.T), name))
        fused = helper.make_node("FusedMatMul", list(node.input), list(node.output), name=node.name + "_t",
                                 domain="com.microsoft", transB=1)
        model.graph.node[k].CopyFrom(fused)
        rewritten += 1
    dst.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(dst / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=1024)
    for side in src.iterdir():
        if not side.name.startswith("model.onnx"):
            shutil.copyfile(side, dst / side.name)
    return rewritten


def main():
    from models.hf_checkpoint import REAL_SHAPES, write_checkpoint
    from specsample_cupy.convert import convert

    gqa, timer = _sibling("gqa_layout"), _sibling("converted_graph").median_device_ms
    parser = gqa.probe_parser(reps=30, bandwidth_gbs=3350.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--converted", type=Path, default=None,
                        help="a converted GroupQueryAttention folder to use (default: built under --work)")
    args = parser.parse_args()
    hf, kn, nk = args.work / "hf", args.converted or args.work / "gqa", args.work / "gqa-nk"
    if not (kn / "config.json").exists():
        if not (hf / "config.json").exists():
            write_checkpoint(hf, REAL_SHAPES[args.shape], dtype="bfloat16")
        convert(hf, kn, attention="gqa", overwrite=True)
    rewritten = transposed_copy(kn, nk)
    weight_bytes = sum(p.stat().st_size for p in kn.glob("model.onnx*"))
    report = {"shape": args.shape, "capacity": args.capacity, "rewritten_matmuls": rewritten,
              "floor_ms": round(weight_bytes / args.bandwidth_gbs / 1e6, 3), "run_ms": {}}
    for batch, steps in ((1, 1), (1, 5), (4, 1)):
        runners = {name: gqa.gqa_runner(folder, batch, args.capacity, steps) for name, folder in
                   (("in_out MatMul", kn), ("out_in FusedMatMul transB", nk))}
        times = {name: [] for name in runners}
        for _ in range(args.rounds):
            for name, (run, stream) in runners.items():
                times[name].append(timer(run, stream, args.reps))
        report["run_ms"][f"B{batch}_S{steps}"] = {name: {"median": round(float(np.median(t)), 4),
                                                         "range": [round(min(t), 4), round(max(t), 4)]}
                                                  for name, t in times.items()}
        print(f"B{batch}_S{steps}", report["run_ms"][f"B{batch}_S{steps}"], flush=True)
        del runners
    import cupy
    report["gpu"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(json.dumps(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, separators=(",", ":")))


if __name__ == "__main__":
    main()
