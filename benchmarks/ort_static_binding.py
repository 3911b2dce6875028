"""How much of a decoder run is ONNX Runtime's host work, and what static bindings + CUDA graphs save.

For each model of the embedded pair, one step (S = 1, the draft's shape) and one verification pass
(S = 6, the target's at gamma = 5), B = 4, a past of `capacity` cache columns:
  dynamic  - rebind every input/output before each run (what a growing cache needs);
  static   - bind once to fixed buffers (past at full capacity, holes masked), then only run;
  graph    - the static binding in a session with enable_cuda_graph: ONNX Runtime captures the
             first runs of each gpu_graph_id and replays the graph afterwards.
Reports host µs per run (perf_counter around the run call) and device µs per run (CUDA events on the
stream), and checks the graph replay's logits against the plain session for the same inputs, which
change in place between replays.

    python benchmarks/ort_static_binding.py [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import cupy as cp
import numpy as np

from specsample_cupy.sessions import DecoderSession, ModelSpec
from specsample_cupy.decoder import default_model_dir


def make_session(spec, stream, graph: bool):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.log_severity_level = 3
    cuda = {"device_id": "0", "user_compute_stream": str(stream.ptr), "use_tf32": "0"}
    if graph:
        cuda["enable_cuda_graph"] = "1"
    return ort.InferenceSession(str(spec.onnx_path), options,
                                providers=[("CUDAExecutionProvider", cuda), "CPUExecutionProvider"])


def buffers(meta: DecoderSession, batch, steps, capacity, rng):
    V, H, D = meta.vocab_size, meta.n_kv_heads, meta.head_dim
    b = {"input_ids": cp.asarray(rng.integers(0, V, (batch, steps)), cp.int64),
         "position_ids": cp.asarray(np.tile(np.arange(capacity, capacity + steps), (batch, 1)), cp.int64),
         "attention_mask": cp.asarray((rng.random((batch, capacity + steps)) < 0.9), cp.int64),
         "logits": cp.empty((batch, steps, V), cp.float32)}
    for past, present in meta.cache_names:
        b[past] = cp.asarray(rng.standard_normal((batch, H, capacity, D)), cp.float32)
        b[present] = cp.empty((batch, H, capacity + steps, D), cp.float32)
    return b


def bind_all(binding, meta, bufs):
    for name, arr in bufs.items():
        is_output = name == "logits" or name.startswith("present")
        bind = binding.bind_output if is_output else binding.bind_input
        bind(name, "cuda", 0, arr.dtype.type, arr.shape, arr.data.ptr)


def refresh(bufs, rng, V):
    """New token ids and a new mask, written in place (the addresses a graph replays with stay put)."""
    bufs["input_ids"][...] = cp.asarray(rng.integers(0, V, bufs["input_ids"].shape))
    mask = (rng.random(bufs["attention_mask"].shape) < 0.9)
    mask[:, -bufs["input_ids"].shape[1]:] = True
    bufs["attention_mask"][...] = cp.asarray(mask, cp.int64)


def measure(session, meta, bufs, stream, mode, graph_id, runs, rng):
    import onnxruntime as ort
    binding = session.io_binding()
    options = ort.RunOptions()
    options.add_run_config_entry("disable_synchronize_execution_providers", "1")
    options.add_run_config_entry("gpu_graph_id", str(graph_id))
    if mode != "dynamic":
        bind_all(binding, meta, bufs)
    host, device = [], []
    with stream:
        for i in range(runs):
            refresh(bufs, rng, meta.vocab_size)
            start, end = cp.cuda.Event(), cp.cuda.Event()
            t0 = time.perf_counter()
            if mode == "dynamic":
                bind_all(binding, meta, bufs)
            start.record(stream)
            session.run_with_iobinding(binding, options)
            end.record(stream)
            host.append(time.perf_counter() - t0)
            end.synchronize()
            device.append(cp.cuda.get_elapsed_time(start, end) * 1e3)
    return statistics.median(host[5:]) * 1e6, statistics.median(device[5:])


def check_replay(plain, graph, meta, bufs, stream, graph_id, rng, runs=6):
    """Max |logits(graph replay) - logits(plain session)| over runs with fresh inputs each time."""
    import onnxruntime as ort
    g_bind, p_bind = graph.io_binding(), plain.io_binding()
    bind_all(g_bind, meta, bufs)
    ref = {k: (cp.empty_like(v) if k == "logits" or k.startswith("present") else v) for k, v in bufs.items()}
    bind_all(p_bind, meta, ref)
    opt_g, opt_p = ort.RunOptions(), ort.RunOptions()
    for o, gid in ((opt_g, graph_id), (opt_p, -1)):
        o.add_run_config_entry("disable_synchronize_execution_providers", "1")
        o.add_run_config_entry("gpu_graph_id", str(gid))
    worst = 0.0
    with stream:
        for _ in range(runs):
            refresh(bufs, rng, meta.vocab_size)
            graph.run_with_iobinding(g_bind, opt_g)
            plain.run_with_iobinding(p_bind, opt_p)
            stream.synchronize()
            worst = max(worst, float(cp.abs(bufs["logits"] - ref["logits"]).max()))
    return worst


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--capacity", type=int, default=128)
    ap.add_argument("--runs", type=int, default=60)
    a = ap.parse_args(argv)
    stream = cp.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(0)
    rows = []
    for role in ("draft", "target"):
        spec = ModelSpec.from_dir(default_model_dir(role))
        meta = DecoderSession(spec, "cuda", stream)
        plain = make_session(spec, stream, graph=False)
        try:
            graph = make_session(spec, stream, graph=True)
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            graph, graph_error = None, f"{type(e).__name__}: {e}"
        for graph_id, steps in ((1, 1), (2, 6)):
            bufs = buffers(meta, a.batch, steps, a.capacity, rng)
            row = {"model": role, "S": steps, "batch": a.batch, "capacity": a.capacity}
            for mode, session in (("dynamic", plain), ("static", plain), ("graph", graph)):
                if session is None:
                    row[mode] = graph_error
                    continue
                try:
                    gid = graph_id if mode == "graph" else -1
                    row[mode + "_host_us"], row[mode + "_device_us"] = measure(
                        session, meta, bufs, stream, mode, gid, a.runs, rng)
                except Exception as e:  # noqa: BLE001
                    row[mode] = f"{type(e).__name__}: {str(e)[:300]}"
            if graph is not None and "graph_host_us" in row:
                row["graph_max_abs_diff"] = check_replay(plain, graph, meta, bufs, stream, graph_id, rng)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"{'model':7} {'S':>2} | {'dynamic host/dev us':>20} | {'static host/dev us':>19} | "
          f"{'graph host/dev us':>18} | max|diff|")
    for r in rows:
        cell = lambda m: (f"{r[m + '_host_us']:7.1f} / {r[m + '_device_us']:7.1f}"  # noqa: E731
                          if m + "_host_us" in r else "failed")
        print(f"{r['model']:7} {r['S']:2d} | {cell('dynamic'):>20} | {cell('static'):>19} | "
              f"{cell('graph'):>18} | {r.get('graph_max_abs_diff', float('nan')):.2e}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
