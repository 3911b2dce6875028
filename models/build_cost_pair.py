"""Cost-realistic versions of the embedded pair: same logits, real models' per-run cost.

The embedded models are so small that a run is launch-bound. ``build_model``
adds "ballast" to a decoder graph: work that reads as many weight bytes per run
as a real model, multiplied at the end by an all-zero matrix, so logits and
presents stay bit-identical (``check_logits_equal``). With y the fp32 output of
the final LayerNorm (ln_f), [B, S, d_model], which the LM head reads:

    h  = Cast16(LayerNorm(y)) @ W_up                  [B, S, d]    W_up [d_model, d]
    h  = LayerNorm(h + tanh(h @ W1_k) @ W2_k)          K blocks     W1 [d, f], W2 [f, d]
    y' = y + Cast32(h @ W_zero)                        W_zero [d, d_model] = 0
    logits = y' @ wte^T == y @ wte^T                   as h is finite (LayerNorm, tanh)

After ln_f, not before: ORT fuses the last residual Add with ln_f into a
SkipLayerNormalization that rounds differently from the unfused ops, so an Add
before ln_f changes the logits by ~2e-6; after it the original graph is
untouched and y + 0 == y. Ballast weights are fp16 and used as fp16 (no Cast
the GPU session could fold into fp32 copies); the ops are MatMul, Add, Tanh,
LayerNormalization, Cast: no shape arithmetic, so CUDA graph capture still
works. Block k uses weight set k % distinct: bytes per run are real (distinct
bytes >> the GPU's ~50 MB L2), files stay small and quick to write.

Presets (``bytes_per_run(spec, d_model)``, GB = 1e9 B; ~ Qwen2.5-1.5B/-7B/-0.5B fp16):

    pair       model   blocks  d     f      distinct  GB/run  ballast.bin
    cost-1.5b  target  28      1536  17408  4         2.996   0.429 GB
               draft   24      1024  10240  6         1.007   0.252 GB
    cost-7b    target  32      4096  28672  4         15.035  1.881 GB
               draft   24      1024  10240  6         1.007   0.252 GB

No attention is added: the ballast costs the same at every context length.
    python -m models.build_cost_pair --pair cost-7b --out DIR [--check cpu|cuda|none]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FORMAT_VERSION = 1
EMBEDDED = Path(__file__).resolve().parent / "stdlib-code"
SIDE_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json")
DATA_FILE = "ballast.bin"
PREFIX = "ballast."  # every ballast initializer and node name starts with it
_ALIGN = 4096        # external tensors start on page boundaries (mmap-friendly)
_CHUNK = 1 << 24     # float32 values generated at a time


@dataclass(frozen=True)
class BallastSpec:
    """``blocks`` blocks of width ``d``, FFN width ``ffn``, cycling ``distinct`` W1/W2 sets."""
    blocks: int
    d: int
    ffn: int
    distinct: int


_DRAFT_05B = BallastSpec(blocks=24, d=1024, ffn=10240, distinct=6)
PAIRS: dict[str, dict[str, BallastSpec] | None] = {
    "embedded": None,
    "cost-1.5b": {"target": BallastSpec(28, 1536, 17408, 4), "draft": _DRAFT_05B},
    "cost-7b": {"target": BallastSpec(32, 4096, 28672, 4), "draft": _DRAFT_05B},
}


def bytes_per_run(spec: BallastSpec, d_model: int = 0) -> int:
    """Ballast weight bytes one run reads (fp16, repeats counted): K (W1, W2, LN) + W_up, W_zero."""
    per_block = 2 * spec.d * spec.ffn + 2 * spec.d  # W1, W2, LayerNorm gamma/beta
    return 2 * (spec.blocks * per_block + 2 * d_model * spec.d)


def distinct_bytes(spec: BallastSpec, d_model: int = 0) -> int:
    """Ballast bytes stored (and resident on the device): the distinct sets only."""
    return 2 * (spec.distinct * 2 * spec.d * spec.ffn + 2 * spec.d + 2 * d_model * spec.d)


def default_root() -> Path:
    return Path.home() / ".cache" / "specsample" / "pairs"


def _ln_f_output(model: onnx.ModelProto) -> tuple[int, str, int]:
    """(node index, output name, output type) of ln_f: the LayerNormalization reached
    from the first output (logits) back along first inputs, through the LM head."""
    producer = {out: i for i, n in enumerate(model.graph.node) for out in n.output}
    name = model.graph.output[0].name
    while name in producer:
        i = producer[name]
        node = model.graph.node[i]
        if node.op_type == "LayerNormalization":
            inferred = onnx.shape_inference.infer_shapes(model)
            types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
            return i, node.output[0], types.get(node.output[0], TensorProto.FLOAT)
        name = node.input[0]
    raise ValueError("no LayerNormalization found before the model's first output")


class _Writer:
    """Streams fp16 tensors into one external-data file; returns external TensorProtos."""

    def __init__(self, path: Path, rng: np.random.Generator):
        self.f, self.rng, self.location = open(path, "wb"), rng, path.name

    def tensor(self, name: str, shape: tuple[int, ...], std: float) -> TensorProto:
        """normal(0, std) values generated as float32 in chunks, stored as fp16; std 0: zeros."""
        self.f.seek(-self.f.tell() % _ALIGN, os.SEEK_CUR)
        offset, n = self.f.tell(), int(np.prod(shape))
        for start in range(0, n, _CHUNK):
            m = min(_CHUNK, n - start)
            vals = self.rng.standard_normal(m, dtype=np.float32) * std if std else np.zeros(m)
            self.f.write(vals.astype(np.float16).tobytes())
        t = TensorProto(name=name, data_type=TensorProto.FLOAT16, dims=shape,
                        data_location=TensorProto.EXTERNAL)
        for key, value in (("location", self.location), ("offset", offset), ("length", 2 * n)):
            t.external_data.add(key=key, value=str(value))
        return t


def build_model(src_dir: Path, dst_dir: Path, spec: BallastSpec, seed: int = 0, *,
                check: bool | str = True) -> Path:
    """Write dst_dir: src_dir's side files + model.onnx with ``spec``'s ballast + ballast.bin.

    check: True/"cpu" or "cuda" runs ``check_logits_equal`` with that provider; False skips.
    """
    src_dir, dst_dir = Path(src_dir), Path(dst_dir)
    dst_dir.mkdir(parents=True, exist_ok=True)
    for name in SIDE_FILES:
        shutil.copy2(src_dir / name, dst_dir / name)
    model = onnx.load(str(src_dir / "model.onnx"))
    d_model = _read_json(src_dir / "config.json")["n_embd"]
    ln_idx, y, y_type = _ln_f_output(model)
    if max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) < 17:
        raise ValueError("LayerNormalization needs opset >= 17")

    nodes, d = [], spec.d

    def op(op_type, inputs, **attrs):  # one ballast node; returns its output's name
        out = f"{PREFIX}t{len(nodes)}"
        nodes.append(helper.make_node(op_type, inputs, [out], name=out + "_" + op_type, **attrs))
        return out

    w = _Writer(dst_dir / DATA_FILE, np.random.default_rng(seed))
    inits = [
        numpy_helper.from_array(np.ones(d_model, np.float32), PREFIX + "ln_in.g"),
        numpy_helper.from_array(np.zeros(d_model, np.float32), PREFIX + "ln_in.b"),
        numpy_helper.from_array(np.ones(d, np.float16), PREFIX + "ln.g"),
        numpy_helper.from_array(np.zeros(d, np.float16), PREFIX + "ln.b"),
        w.tensor(PREFIX + "w_up", (d_model, d), d_model ** -0.5),
    ]
    for s in range(spec.distinct):
        inits.append(w.tensor(f"{PREFIX}w1.{s}", (d, spec.ffn), d ** -0.5))
        inits.append(w.tensor(f"{PREFIX}w2.{s}", (spec.ffn, d), spec.ffn ** -0.5))
    inits.append(w.tensor(PREFIX + "w_zero", (d, d_model), 0.0))
    w.f.close()
    h = op("Cast", [op("LayerNormalization", [y, PREFIX + "ln_in.g", PREFIX + "ln_in.b"],
                       axis=-1, epsilon=1e-5)], to=TensorProto.FLOAT16)
    h = op("MatMul", [h, PREFIX + "w_up"])
    for k in range(spec.blocks):
        s = k % spec.distinct
        t = op("MatMul", [op("Tanh", [op("MatMul", [h, f"{PREFIX}w1.{s}"])]), f"{PREFIX}w2.{s}"])
        h = op("LayerNormalization", [op("Add", [h, t]), PREFIX + "ln.g", PREFIX + "ln.b"],
               axis=-1, epsilon=1e-5)
    y_new = op("Add", [y, op("Cast", [op("MatMul", [h, PREFIX + "w_zero"])], to=y_type)])
    for node in model.graph.node:  # the LM head now reads y + 0
        node.input[:] = [y_new if i == y else i for i in node.input]
    old = list(model.graph.node)  # ballast right after ln_f keeps the order topological
    del model.graph.node[:]
    model.graph.node.extend([*old[:ln_idx + 1], *nodes, *old[ln_idx + 1:]])
    model.graph.initializer.extend(inits)
    onnx.save_model(model, str(dst_dir / "model.onnx"))
    onnx.checker.check_model(str(dst_dir / "model.onnx"))
    if check:
        providers = ["CUDAExecutionProvider"] if check == "cuda" else ["CPUExecutionProvider"]
        check_logits_equal(src_dir, dst_dir, providers)
    return dst_dir


def _session(path: Path, providers, optimized: Path | None = None):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.disable_prepacking", "1")  # no per-node weight copies
    if optimized is not None:  # > 2 GB models need their initializers written outside the proto
        opts.optimized_model_filepath = str(optimized)
        key = "session.optimized_model_external_initializers_"
        opts.add_session_config_entry(key + "file_name", optimized.stem + ".bin")
        opts.add_session_config_entry(key + "min_size_in_bytes", "1024")
    sess = ort.InferenceSession(str(path), sess_options=opts, providers=list(providers))
    if list(providers)[0] not in sess.get_providers():  # ORT falls back to the CPU silently
        raise RuntimeError(f"{providers[0]} is not available: {sess.get_providers()}")
    return sess


def check_logits_equal(src_dir: Path, dst_dir: Path,
                       providers=("CPUExecutionProvider",), *, atol: float = 1e-6) -> float:
    """Run both models on B=2: a 5-token prefill, then 1 step on its presents; the largest
    difference of logits and presents (0.0 on the CPU: the original graph is untouched).

    Raises AssertionError if it exceeds atol or dst's logits are not finite."""
    cfg, rng = _read_json(Path(src_dir) / "config.json"), np.random.default_rng(0)
    L, H, hd = cfg["n_layer"], cfg["n_head"], cfg["n_embd"] // cfg["n_head"]
    runs = [_session(Path(m) / "model.onnx", providers) for m in (src_dir, dst_dir)]
    past = [[np.zeros((2, H, 0, hd), np.float32)] * (2 * L) for _ in runs]
    worst = 0.0
    for S in (5, 1):
        ids = rng.integers(0, cfg["vocab_size"], (2, S))
        P = past[0][0].shape[2]
        outs = []
        for sess, pkv in zip(runs, past):
            feed = {"input_ids": ids, "attention_mask": np.ones((2, P + S), np.int64),
                    "position_ids": np.tile(np.arange(P, P + S), (2, 1))}
            feed.update({f"past_key_values.{i // 2}.{('key', 'value')[i % 2]}": p
                         for i, p in enumerate(pkv)})
            outs.append(sess.run(None, feed))
        worst = max([worst, *(float(np.max(np.abs(a - b))) for a, b in zip(*outs))])
        if not (np.all(np.isfinite(outs[1][0])) and worst <= atol):
            raise AssertionError(f"{dst_dir}: logits/presents differ from {src_dir} by {worst}")
        past = [o[1:] for o in outs]
    return worst


def ballast_nodes_survive(model_dir: Path, providers=("CPUExecutionProvider",)) -> int:
    """MatMul/Gemm-like nodes of ORT's *optimized* graph that read a ballast weight.

    A model built with K blocks should give 2K + 2 (W_up, K*(W1, W2), W_zero):
    nothing folded away. Inputs reached through Cast nodes count too, and
    names ORT derives from a ballast weight (the CPU EP, lacking fp16 kernels,
    inserts "InsertedPrecisionFreeCast_ballast.w1.0" and the like).
    """
    with tempfile.TemporaryDirectory() as tmp:
        opt = Path(tmp) / "optimized.onnx"
        _session(Path(model_dir) / "model.onnx", providers, optimized=opt)
        graph = onnx.load(str(opt), load_external_data=False).graph
    cast_of = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Cast"}
    root = lambda name: root(cast_of[name]) if name in cast_of else name  # noqa: E731
    return sum(1 for n in graph.node if "MatMul" in n.op_type or "Gemm" in n.op_type
               if any(PREFIX + "w" in root(i) for i in n.input))


def build_pair(name: str, out_root: Path | None = None, *, seed: int = 0,
               check: bool | str = True) -> tuple[Path, Path]:
    """(target_dir, draft_dir) of the named pair, built under out_root/name once and reused.

    A build is reused when out_root/name/manifest.json (written last) matches
    the specs, seed, format version and the embedded models' hashes.
    """
    if name not in PAIRS:
        raise KeyError(f"unknown pair {name!r}; known: {sorted(PAIRS)}")
    specs = PAIRS[name]
    if specs is None:
        return EMBEDDED / "target", EMBEDDED / "draft"
    out = Path(out_root or default_root()) / name
    manifest = {"format": FORMAT_VERSION, "pair": name, "seed": seed,
                **{role: {"spec": asdict(spec), "source": hashlib.sha256(
                    (EMBEDDED / role / "model.onnx").read_bytes()).hexdigest()}
                   for role, spec in specs.items()}}
    files = (*SIDE_FILES, "model.onnx", DATA_FILE)
    if _read_json(out / "manifest.json") == manifest and all(
            (out / role / f).is_file() for role in specs for f in files):
        return out / "target", out / "draft"
    shutil.rmtree(out, ignore_errors=True)
    for role, spec in specs.items():
        build_model(EMBEDDED / role, out / role, spec, seed, check=check)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return out / "target", out / "draft"


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # a missing or half-written file
        return None


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", default="cost-7b", choices=sorted(PAIRS))
    ap.add_argument("--out", type=Path, default=None, help=f"default {default_root()}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", default="cpu", choices=("cpu", "cuda", "none"))
    a = ap.parse_args(argv)
    check = {"cpu": True, "cuda": "cuda", "none": False}[a.check]
    target, draft = build_pair(a.pair, a.out, seed=a.seed, check=check)
    for role, path in (("target", target), ("draft", draft)):
        spec, d_model = (PAIRS[a.pair] or {}).get(role), _read_json(path / "config.json")["n_embd"]
        gb = bytes_per_run(spec, d_model) / 1e9 if spec else 0.0
        print(f"{role}\t{path}\tballast {gb:.3f} GB per run")


if __name__ == "__main__":
    main()
