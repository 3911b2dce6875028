"""The two attention layouts of converted graphs at a real shape, on CUDA: device ms of one captured
run of S new columns over a cache of the given capacity, "onnx" (ONNX Attention over the masked
cache, sessions_static's binding) against "gqa" (GroupQueryAttention writing in place into one shared
buffer per cache), with the weight-read floor beside them. Random weights; nothing is downloaded.

    python benchmarks/probes/gqa_layout.py --shape qwen2.5-1.5b --work /tmp/gqa [--capacity 256] [--json F]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import numpy as np


def _sibling(name):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gqa_times(model_dir: Path, batch: int, capacity: int, steps: int, reps: int, timer) -> float:
    """Median device ms of one replayed run: rows holding capacity/2 tokens, S new ones each."""
    run, stream = gqa_runner(model_dir, batch, capacity, steps)
    return timer(run, stream, reps)


def gqa_runner(model_dir: Path, batch: int, capacity: int, steps: int):
    """(run, stream): run() replays one run of S new columns per row over rows holding capacity/2
    tokens, on `stream` (the first calls capture the graph)."""
    import cupy

    from specsample_cupy.runtime.ort_session import _inference_session, run_options

    stream = cupy.cuda.Stream(non_blocking=True)
    session = _inference_session(model_dir / "model.onnx", "cuda", stream, 0, cuda_graph=True)
    binding = session.io_binding()
    past_names = [i.name for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    _, kv_heads, _, head_dim = session.get_inputs()[3].shape
    vocab = session.get_outputs()[0].shape[-1]
    count = capacity // 2
    with stream:
        ids = cupy.ones((batch, steps), cupy.int64)
        mask = cupy.zeros((batch, capacity), cupy.int64)
        mask[:, :count + steps] = 1
        logits = cupy.empty((batch, steps, vocab), cupy.float16)
        caches = [cupy.zeros((batch, kv_heads, capacity, head_dim), cupy.float16) for _ in past_names]
    bind = lambda f, name, a: f(name, "cuda", 0, a.dtype.type, a.shape, a.data.ptr)  # noqa: E731
    bind(binding.bind_input, "input_ids", ids)
    bind(binding.bind_input, "attention_mask", mask)
    binding.bind_cpu_input("total_sequence_length", np.array([capacity], np.int32))
    for past, cache in zip(past_names, caches):
        bind(binding.bind_input, past, cache)
        bind(binding.bind_output, past.replace("past_key_values", "present"), cache)
    bind(binding.bind_output, "logits", logits)
    options = run_options("cuda", 1)
    keep = (ids, mask, logits, caches)   # the bound buffers live as long as run

    def run(_keep=keep):
        session.run_with_iobinding(binding, options)

    return run, stream


def probe_parser(reps: int, bandwidth_gbs: float) -> argparse.ArgumentParser:
    """The arguments the real-shape probes share (this one and weight_layout.py)."""
    from models.hf_checkpoint import REAL_SHAPES

    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="qwen2.5-1.5b", choices=sorted(REAL_SHAPES))
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--capacity", type=int, default=256)
    parser.add_argument("--reps", type=int, default=reps)
    parser.add_argument("--bandwidth-gbs", type=float, default=bandwidth_gbs)
    parser.add_argument("--json", default=None)
    return parser


def main():
    from models.hf_checkpoint import REAL_SHAPES, write_checkpoint
    from specsample_cupy.convert import convert

    args = probe_parser(reps=50, bandwidth_gbs=4200.0).parse_args()
    graph_probe = _sibling("converted_graph")
    hf = args.work / "hf"
    if not (hf / "config.json").exists():
        write_checkpoint(hf, REAL_SHAPES[args.shape], dtype="bfloat16")
    report = {"shape": args.shape, "capacity": args.capacity, "layouts": {}}
    for layout in ("onnx", "gqa"):
        out = args.work / layout
        if not (out / "config.json").exists():
            convert(hf, out, attention=layout, overwrite=True)
        weight_bytes = sum(p.stat().st_size for p in out.glob("model.onnx*"))
        report["floor_ms"] = round(weight_bytes / args.bandwidth_gbs / 1e6, 3)
        runs = {}
        for batch, steps in ((1, 1), (1, 5), (4, 1), (4, 5)):
            if layout == "gqa" and batch > 1 and steps > 1:
                continue   # ONNX Runtime's GroupQueryAttention: S > 1 over a past at batch 1 only
            try:
                if layout == "gqa":
                    ms = gqa_times(out, batch, args.capacity, steps, args.reps, graph_probe.median_device_ms)
                else:
                    ms = graph_probe.run_times(out, batch, args.capacity, steps, args.reps)
                runs[f"B{batch}_S{steps}"] = round(ms, 4)
            except Exception as exc:  # noqa: BLE001 - a probe reports what failed and goes on
                runs[f"B{batch}_S{steps}"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        report["layouts"][layout] = {"run_ms": runs, "ops": graph_probe.optimized_ops(out / "model.onnx")}
        print(layout, runs, flush=True)
    print(json.dumps(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, separators=(",", ":")))


if __name__ == "__main__":
    main()
