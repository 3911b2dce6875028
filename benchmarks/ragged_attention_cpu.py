"""The CPU cost of the KV cache's attention, three layers shaped as the embedded target's (B = 16 rows,
4 heads of 32), per model run, in ONNX Runtime's CPU build:
  concat  the exported graphs' way: Concat past and new into present, then MatMul / Softmax / MatMul
          over every column: each run copies the whole past, and every row pays the widest row's width;
  gqa     com.microsoft GroupQueryAttention with past and present sharing one [B, H, cap, D] buffer and
          per-row lengths: nothing copied, each row attends over its own columns only (ragged).
Widths 156 and 216 are static and continuous batching's mean cache widths (256 requests, B = 16).

    python3 benchmarks/ragged_attention_cpu.py

S = 1 is a draft run; S = 5 the target's verification run (gamma 4), which ONNX Runtime's CPU
GroupQueryAttention refuses for more than one row (the error is printed)."""
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper as h

B, H, D, L = 16, 4, 32, 3
CAP = 260


def concat_model():
    nodes, inputs, outputs = [], [], []
    for l in range(L):
        q, k, v, pk, pv, m = f"q{l}", f"k{l}", f"v{l}", f"pk{l}", f"pv{l}", "bias"
        inputs += [h.make_tensor_value_info(n, TP.FLOAT, ["B", H, "S", D]) for n in (q, k, v)]
        inputs += [h.make_tensor_value_info(n, TP.FLOAT, ["B", H, "T", D]) for n in (pk, pv)]
        nodes += [h.make_node("Concat", [pk, k], [f"K{l}"], axis=2), h.make_node("Concat", [pv, v], [f"V{l}"], axis=2),
                  h.make_node("Transpose", [f"K{l}"], [f"Kt{l}"], perm=[0, 1, 3, 2]),
                  h.make_node("MatMul", [q, f"Kt{l}"], [f"s{l}"]), h.make_node("Add", [f"s{l}", m], [f"sb{l}"]),
                  h.make_node("Softmax", [f"sb{l}"], [f"p{l}"], axis=-1), h.make_node("MatMul", [f"p{l}", f"V{l}"], [f"o{l}"])]
        outputs += [h.make_tensor_value_info(n, TP.FLOAT, None) for n in (f"o{l}", f"K{l}", f"V{l}")]
    inputs.append(h.make_tensor_value_info("bias", TP.FLOAT, ["B", 1, "S", "TT"]))
    g = h.make_graph(nodes, "a", inputs, outputs)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def gqa_model():
    nodes, inputs, outputs = [], [], []
    for l in range(L):
        q, k, v, pk, pv = f"q{l}", f"k{l}", f"v{l}", f"pk{l}", f"pv{l}"
        inputs += [h.make_tensor_value_info(n, TP.FLOAT, ["B", "S", H * D]) for n in (q, k, v)]
        inputs += [h.make_tensor_value_info(n, TP.FLOAT, ["B", H, CAP, D]) for n in (pk, pv)]
        nodes.append(h.make_node("GroupQueryAttention", [q, k, v, pk, pv, "seqlens_k", "total_len"],
                                 [f"o{l}", f"K{l}", f"V{l}"], domain="com.microsoft", num_heads=H, kv_num_heads=H))
        outputs += [h.make_tensor_value_info(f"o{l}", TP.FLOAT, None),
                    h.make_tensor_value_info(f"K{l}", TP.FLOAT, ["B", H, CAP, D]),
                    h.make_tensor_value_info(f"V{l}", TP.FLOAT, ["B", H, CAP, D])]
    inputs += [h.make_tensor_value_info("seqlens_k", TP.INT32, ["B"]), h.make_tensor_value_info("total_len", TP.INT32, [])]
    g = h.make_graph(nodes, "b", inputs, outputs)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])


def session(model):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def per_run_ms(sess, io, reps: int) -> float:
    """Milliseconds per run of `sess` with bindings `io`, after 20 warm-up runs."""
    for _ in range(20):
        sess.run_with_iobinding(io)
    started = time.perf_counter()
    for _ in range(reps):
        sess.run_with_iobinding(io)
    return (time.perf_counter() - started) / reps * 1e3


def bind_inputs(sess, extra: dict, new_shape, past_shape):
    """`sess`'s bindings with `extra` and, for every layer, random q, k, v of new_shape and past keys
    and values (pk, pv) of past_shape as inputs; (bindings, every input by name)."""
    rng = np.random.default_rng(0)
    feeds = dict(extra)
    for l in range(L):
        for n in ("q", "k", "v"):
            feeds[f"{n}{l}"] = rng.standard_normal(new_shape, np.float32)
        for n in ("pk", "pv"):
            feeds[f"{n}{l}"] = rng.standard_normal(past_shape, np.float32)
    io = sess.io_binding()
    for name, value in feeds.items():
        io.bind_cpu_input(name, value)
    return io, feeds


def bind_output(io, name: str, array: np.ndarray) -> None:
    """Output `name` written into `array` (the caller keeps it alive while the bindings run)."""
    io.bind_output(name, "cpu", 0, np.float32, array.shape, array.ctypes.data)


def time_concat(T, S, reps=200):
    sess = session(concat_model())
    io, _ = bind_inputs(sess, {"bias": np.zeros((B, 1, S, T + S), np.float32)}, (B, H, S, D), (B, H, T, D))
    outs = {}
    for l in range(L):
        for n, shape in ((f"o{l}", (B, H, S, D)), (f"K{l}", (B, H, T + S, D)), (f"V{l}", (B, H, T + S, D))):
            outs[n] = np.empty(shape, np.float32)
            bind_output(io, n, outs[n])
    return per_run_ms(sess, io, reps)


def time_gqa(lengths, S, reps=200):
    sess = session(gqa_model())
    lengths_in = {"seqlens_k": (np.asarray(lengths) + S - 1).astype(np.int32),
                  "total_len": np.array(max(lengths) + S, np.int32)}
    io, feeds = bind_inputs(sess, lengths_in, (B, S, H * D), (B, H, CAP, D))
    outs = {}
    for l in range(L):
        outs[f"o{l}"] = np.empty((B, S, H * D), np.float32)
        bind_output(io, f"o{l}", outs[f"o{l}"])
        bind_output(io, f"K{l}", feeds[f"pk{l}"])   # present shares past's buffer
        bind_output(io, f"V{l}", feeds[f"pv{l}"])
    return per_run_ms(sess, io, reps)


def main():
    rng = np.random.default_rng(1)
    print("| S | width | concat ms | gqa, every row at the width, ms | gqa, ragged rows, ms |\n|---|---|---|---|---|")
    for T in (156, 216):
        ragged = rng.integers(16, T + 1, B)
        ragged[0] = T
        print(f"| 1 | {T} | {time_concat(T, 1):.3f} | {time_gqa([T] * B, 1):.3f} | {time_gqa(ragged, 1):.3f} "
              f"(mean {ragged.mean():.0f}) |")
    try:
        time_gqa([156] * B, 5, reps=1)
    except RuntimeError as refused:   # onnxruntime's own exception types derive from it
        print(f"S = 5, B = {B}: {str(refused).splitlines()[-1]}")


if __name__ == "__main__":
    main()
