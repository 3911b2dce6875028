"""Per-request random streams on the GPU: verify_kernel and sample_rows_kernel against the NumPy
reference with streams (same Philox numbers), rows independent of their batch, CUDA-graph replay."""
import numpy as np
import pytest

from helpers_verify import random_problem, softmax
from specsample_cupy import sample_tokens, verify
from test_verify_gpu import _to_dtype

pytestmark = pytest.mark.gpu


def _cp():
    import cupy
    return cupy


def _streams(rng, B):
    return np.stack([rng.integers(-2 ** 62, 2 ** 62, B), rng.integers(0, 2 ** 40, B)], axis=1).astype(np.int64)


STREAM_CONFIGS = [
    # (B, G, V, dtype, mode, extra verify() keywords)
    (1500, 4, 1000, "float32", "exact", {}),
    (1000, 5, 4099, "float32", "exact", {}),            # scalar loads
    (1000, 3, 5000, "float16", "exact", {}),
    (800, 4, 2048, "bfloat16", "exact", {}),
    (1000, 3, 3000, "float32", "probs", {}),
    (800, 5, 2000, "float32", "sigmoid", {}),
    (800, 4, 2000, "float16", "sigmoid-paper", {}),
    (800, 4, 1500, "float32", "greedy", {}),
    (1000, 4, 2000, "float32", "onehot", {}),
    (600, 4, 3000, "float32", "exact", {"top_k": 50, "top_p": 0.9}),   # the warped mode
    (8, 5, 151936, "float32", "exact", {}),
]


def _both(B, G, V, dtype, mode, extra, seed):
    cp = _cp()
    rng = np.random.default_rng(seed)
    temps = rng.choice([0.0, 0.6, 1.0, 1.4] if mode in ("exact", "greedy", "onehot") else [0.6, 1.0, 1.4], B)
    temps = temps.astype(np.float32)
    tokens, draft, target = random_problem(rng, B, G, V, temperature=np.where(temps > 0, temps, 1.0), scale=1.5,
                                           closeness=0.8)
    if mode == "probs":
        draft, target = (softmax(a.astype(np.float64)).astype(np.float32) for a in (draft, target))
        temps = np.ones(B, np.float32)
    lengths = rng.integers(0, G + 1, B).astype(np.int32)
    streams = _streams(rng, B)
    d_dev, d_host = _to_dtype(draft, dtype)
    t_dev, t_host = _to_dtype(target, dtype)
    kw = dict(method={"probs": "exact", "onehot": "exact"}.get(mode, mode), probs=mode == "probs",
              logits_dtype="bfloat16" if dtype == "bfloat16" else None, **extra)
    temp_arg = (lambda xp: 1.0) if mode == "probs" else (lambda xp: xp.asarray(temps))
    gpu = verify(cp.asarray(tokens.astype(np.int32)), None if mode == "onehot" else cp.asarray(d_dev),
                 cp.asarray(t_dev), temperature=temp_arg(cp), draft_lengths=cp.asarray(lengths),
                 streams=cp.asarray(streams), **kw)
    cpu = verify(tokens, None if mode == "onehot" else d_host, t_host, temperature=temp_arg(np),
                 draft_lengths=lengths, streams=streams, **kw)
    return gpu, cpu


def test_streams_kernel_matches_reference():
    total = mismatched = 0
    report = []
    for k, (B, G, V, dtype, mode, extra) in enumerate(STREAM_CONFIGS):
        gpu, cpu = _both(B, G, V, dtype, mode, extra, seed=300 + k)
        gpu.check()
        same = (gpu.accepted.get() == cpu.accepted) & (gpu.tokens.get() == cpu.tokens).all(1)
        total += same.size
        mismatched += int((~same).sum())
        report.append((mode, dtype, V, int((~same).sum())))
    print("\nstreams: kernel vs reference mismatches per config:", report)
    assert mismatched <= 0.001 * total, report


def test_streams_kernel_rows_do_not_depend_on_the_batch():
    """A request's result in a batch equals its result alone (row 0, its stream's seed and offset),
    and moves with it when the rows are permuted (up to the slicing's float near-ties)."""
    cp = _cp()
    rng = np.random.default_rng(11)
    B, G, V = 64, 4, 3000
    tokens, draft, target = random_problem(rng, B, G, V, temperature=0.8, scale=1.5, closeness=0.8)
    streams = _streams(rng, B)
    dev = [cp.asarray(a) for a in (tokens, draft, target)]
    batch = verify(*dev, temperature=0.8, streams=cp.asarray(streams))
    order = rng.permutation(B)
    moved = verify(*(a[cp.asarray(order)] for a in dev), temperature=0.8, streams=cp.asarray(streams[order]))
    same_alone = same_moved = 0
    for b in range(B):
        alone = verify(*(a[b:b + 1] for a in dev), temperature=0.8, seed=int(streams[b, 0]), offset=int(streams[b, 1]))
        same_alone += bool((alone.tokens.get()[0] == batch.tokens.get()[b]).all())
    for k, b in enumerate(order):
        same_moved += bool((moved.tokens.get()[k] == batch.tokens.get()[b]).all())
    assert same_alone >= B - 1 and same_moved >= B - 1, (same_alone, same_moved)


@pytest.mark.parametrize("V", [3000, 3001, 40000])   # sample_rows_kernel (aligned, scalar); verify_kernel
def test_sample_tokens_with_streams_matches_reference(V):
    cp = _cp()
    rng = np.random.default_rng(12)
    B = 256
    logits = (rng.normal(size=(B, V)) * 2).astype(np.float32)
    streams = _streams(rng, B)
    for dtype in (np.float32, np.float16):
        rows = logits.astype(dtype)
        for t in (1.0, 0.5, 0.0):
            gpu = sample_tokens(cp.asarray(rows), temperature=t, streams=cp.asarray(streams)).get()
            cpu = sample_tokens(rows.astype(np.float32), temperature=t, streams=streams)
            assert (gpu == cpu).mean() >= 0.995, (V, dtype, t)
    # The same stream in every row: the same token in every row (rows identical).
    same = cp.asarray(np.repeat(logits[:1], B, axis=0))
    one = sample_tokens(same, temperature=1.0, streams=cp.asarray(np.tile(streams[:1], (B, 1)))).get()
    assert (one == one[0]).all()


def test_streams_cuda_graph_replay_reads_new_offsets():
    cp = _cp()
    rng = np.random.default_rng(13)
    tokens, draft, target = (cp.asarray(a) for a in random_problem(rng, 16, 5, 4096))
    host = _streams(rng, 16)
    streams = cp.asarray(host)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        verify(tokens, draft, target, streams=streams)      # compile + workspace outside capture
        stream.begin_capture()
        res = verify(tokens, draft, target, streams=streams)
        graph = stream.end_capture()
        for step in range(3):
            streams[:, 1] = cp.asarray(host[:, 1] + step)
            graph.launch(stream)
            direct = verify(tokens, draft, target, streams=cp.asarray(host + np.array([0, step])))
            stream.synchronize()
            assert (res.tokens.get() == direct.tokens.get()).all()
