"""The GroupQueryAttention layout of converted graphs (convert(attention="gqa")): one fixed-capacity
buffer per cache that every run writes in place at each row's token count, against the NumPy
reference forward. A rollback is a smaller count (the rejected slots are overwritten by the next
run); batch rows with different counts run S = 1 steps together. CPU and CUDA."""
import numpy as np
import onnxruntime as ort
import pytest

from helpers_convert import TINY
from models.hf_checkpoint import write_checkpoint
from specsample_cupy.convert import convert
from specsample_cupy.convert.checkpoint import Checkpoint
from specsample_cupy.convert.families import llama_shape
from specsample_cupy.convert.numpy_forward import llama_logits

CAPACITY = 32
TOLERANCE = {"float32": 1e-5, "float16": 2e-3}
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _session(tmp_path, name, dtype, device):
    if device == "cuda" and PROVIDERS["cuda"] not in ort.get_available_providers():
        pytest.skip("onnxruntime has no CUDA provider here")
    if device == "cuda" and dtype == "float32":
        pytest.skip("ONNX Runtime's CUDA GroupQueryAttention computes in float16 and bfloat16 only")
    hf = write_checkpoint(tmp_path / "hf", TINY[name], dtype="float32", shards=1, seed=3, embed_scale=0.5)
    out = convert(hf, tmp_path / "out", dtype=dtype, attention="gqa")
    ckpt = Checkpoint(hf)
    return ort.InferenceSession(str(out / "model.onnx"), providers=[PROVIDERS[device]]), ckpt, llama_shape(ckpt.config)


class _Buffers:
    """The caches of a batch: past_key_values.* [B, kv_heads, CAPACITY, head_dim], replaced by each
    run's present (the same buffer where ONNX Runtime shares it; a copy in a plain run)."""

    def __init__(self, session, s, batch, dtype):
        self.session = session
        self.past = {i.name: np.zeros((batch, s.kv_heads, CAPACITY, s.head_dim), dtype)
                     for i in session.get_inputs() if i.name.startswith("past_key_values.")}

    def run(self, ids, counts):
        """Run ids [B, S] on rows holding counts[b] tokens; returns logits [B, S, V]."""
        ids = np.asarray(ids, np.int64)
        total = np.asarray(counts) + ids.shape[1]
        mask = (np.arange(total.max())[None, :] < total[:, None]).astype(np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask,
                 "total_sequence_length": np.array([CAPACITY], np.int32), **self.past}
        outs = self.session.run(None, feeds)
        names = [o.name for o in self.session.get_outputs()]
        self.past = {n.replace("present", "past_key_values"): o for n, o in zip(names[1:], outs[1:])}
        return outs[0]


def _error(got, ref):
    return float(np.abs(np.asarray(got, np.float64) - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", sorted(TINY))
def test_runs_and_rollback_match_reference(tmp_path, name, dtype, device):
    """Prefill, a step, a run of 3 over a past, a rollback of 2 of those (a rejected draft's columns)
    then a run of 2 that overwrites them: every run's logits are the reference's for the kept tokens."""
    session, ckpt, s = _session(tmp_path, name, dtype, device)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, s.vocab_size, (1, 12))
    ref = llama_logits(ckpt.get, s, ids)
    cache = _Buffers(session, s, 1, np.dtype(dtype))
    n = 0
    for S in (5, 1, 3):
        assert _error(cache.run(ids[:, n:n + S], [n]), ref[:, n:n + S]) < TOLERANCE[dtype]
        n += S
    n -= 2                                                         # the last two columns rejected
    other = rng.integers(0, s.vocab_size, (1, 2))
    kept = np.concatenate([ids[:, :n], other], axis=1)
    ref2 = llama_logits(ckpt.get, s, kept)
    assert _error(cache.run(other, [n]), ref2[:, n:]) < TOLERANCE[dtype]


@pytest.mark.parametrize("device,dtype", [("cpu", "float32"), pytest.param("cuda", "float16", marks=pytest.mark.gpu)])
def test_rows_with_different_counts_step_together(tmp_path, device, dtype):
    """Rows prefilled one at a time (S > 1 over a past runs at batch 1 only), then S = 1 steps of the
    batch: each row attends to its own count."""
    session, ckpt, s = _session(tmp_path, "qwen2-tied", dtype, device)
    rng = np.random.default_rng(1)
    lengths = [7, 3]
    seqs = [rng.integers(0, s.vocab_size, (1, n + 2)) for n in lengths]
    rows = []
    for seq, n in zip(seqs, lengths):
        row = _Buffers(session, s, 1, np.dtype(dtype))
        row.run(seq[:, :n], [0])
        rows.append(row.past)
    batch = _Buffers(session, s, 2, np.dtype(dtype))
    batch.past = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
    counts = np.array(lengths)
    for j in range(2):
        step = batch.run(np.array([[seq[0, n + j]] for seq, n in zip(seqs, lengths)]), counts + j)
        for b, (seq, n) in enumerate(zip(seqs, lengths)):
            ref = llama_logits(ckpt.get, s, seq[:, :n + j + 1])[:, -1]
            assert _error(step[b], ref) < TOLERANCE[dtype]


def test_unknown_layout_is_refused(tmp_path):
    from specsample_cupy.convert import ConversionError
    with pytest.raises(ConversionError, match="attention"):
        convert(tmp_path, tmp_path / "out", attention="flash")


def test_the_host_loop_refuses_the_layout(tmp_path):
    """On the CPU (no fixed bindings) a GroupQueryAttention folder is refused in one line naming the way out."""
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    from test_convert_decode import converted_self_pair
    target, draft = converted_self_pair(tmp_path, "float32", attention="gqa")
    with pytest.raises(ValueError, match="--attention onnx"):
        SpeculativeDecoder(target, draft, device="cpu")
