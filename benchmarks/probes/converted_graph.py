"""What ONNX Runtime makes of a converted model on CUDA: the optimized graph's node count by op type
(which fusions fired) and the device time of one captured run at S = 1 and S = 5, against the time to
read its weights once at the given bandwidth.

    python benchmarks/probes/converted_graph.py MODEL_DIR [--capacity 256] [--batch 1] [--json F]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile
from pathlib import Path

import numpy as np


def optimized_ops(model_path: Path) -> dict[str, int]:
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.log_severity_level = 0   # verbose: the log lists nodes placed on the CPU
        options.optimized_model_filepath = os.path.join(tmp, "opt.onnx")
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "opt.data")
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        ort.InferenceSession(str(model_path), options, providers=["CUDAExecutionProvider"])
        graph = onnx.load(options.optimized_model_filepath, load_external_data=False).graph
    return dict(collections.Counter(n.op_type for n in graph.node).most_common())


def run_times(model_dir: Path, batch: int, capacity: int, steps: int, reps: int = 50) -> float:
    """Median device ms of one replayed run of `steps` new columns over a full-capacity cache."""
    import cupy

    from specsample_cupy.runtime.model_folder import ModelSpec
    from specsample_cupy.runtime.sessions_static import StaticDecoderSession

    stream = cupy.cuda.Stream(non_blocking=True)
    session = StaticDecoderSession(ModelSpec.from_dir(model_dir), "cuda", stream, 0)
    cache = session.new_cache(batch, capacity)
    ids = np.ones((batch, steps), np.int64)
    mask = np.ones((batch, steps), np.int64)
    positions = np.tile(np.arange(steps), (batch, 1))

    def run():
        cache.length, cache.mask = 0, np.zeros((batch, 0), np.int64)
        with stream:
            session.forward(cache, ids, mask, positions)

    return median_device_ms(run, stream, reps)


def median_device_ms(run, stream, reps: int, warmup: int = 3) -> float:
    """Median ms between CUDA events around run() on `stream`, after `warmup` unmeasured calls (the
    first ones capture the graph)."""
    import cupy

    times = []
    for r in range(reps + warmup):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        run()
        end.record(stream)
        end.synchronize()
        if r >= warmup:
            times.append(cupy.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--capacity", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--bandwidth-gbs", type=float, default=4200.0, help="for the weight-read floor")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--steps", default="1,5", help="new columns per run, comma-separated")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    onnx_path = args.model_dir / "model.onnx"
    weight_bytes = sum(p.stat().st_size for p in args.model_dir.glob("model.onnx*"))
    report = {"model": str(args.model_dir), "weight_bytes": weight_bytes,
              "floor_ms": weight_bytes / args.bandwidth_gbs / 1e6, "ops": optimized_ops(onnx_path),
              "run_ms": {s: run_times(args.model_dir, args.batch, args.capacity, int(s), args.reps)
                         for s in args.steps.split(",")}}
    print(json.dumps(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, separators=(",", ":")))


if __name__ == "__main__":
    main()
