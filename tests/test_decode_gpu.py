"""The decoder on the GPU: same tokens as on the CPU, and logits that never leave the device."""
import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from specsample_cupy.decode import host_loop as decode_host  # noqa: E402
from specsample_cupy.decode.decoder import SpeculativeDecoder  # noqa: E402
from specsample_cupy.runtime.sessions_cache import buffer_ptr  # noqa: E402
from specsample_cupy.verification.api import VerifyResult  # noqa: E402

from helpers_decode_gpu import GPU_DECODE, PROMPTS  # noqa: E402

pytestmark = GPU_DECODE


@pytest.fixture(scope="module")
def gpu(pair):
    return SpeculativeDecoder(*pair, device="cuda")


@pytest.fixture(scope="module")
def cpu(pair):
    return SpeculativeDecoder(*pair, device="cpu")


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_speculative_equals_target_only_on_gpu(gpu, cpu, gamma):
    expected = gpu.generate(PROMPTS, max_new_tokens=40, method="target", temperature=0).token_ids
    assert gpu.generate(PROMPTS, max_new_tokens=40, gamma=gamma, method="greedy").token_ids == expected
    assert cpu.generate(PROMPTS, max_new_tokens=40, method="target", temperature=0).token_ids == expected


@pytest.mark.parametrize("method", ["exact", "target"])
def test_sampling_on_gpu_matches_cpu_for_the_same_seed(gpu, cpu, method):
    """Same Philox numbers on both devices: identical tokens unless a float near-tie flips a choice, after
    which that request's continuation differs. Allow that for a small fraction of requests."""
    prompts = PROMPTS * 8
    kwargs = dict(max_new_tokens=32, gamma=0 if method == "target" else 4, method=method, temperature=0.9,
                  seed=123)
    on_gpu = gpu.generate(prompts, **kwargs).token_ids
    on_cpu = cpu.generate(prompts, **kwargs).token_ids
    same = np.mean([a == b for a, b in zip(on_gpu, on_cpu)])
    assert same >= 0.9, f"only {same:.0%} of requests identical on GPU and CPU"


def test_no_logits_cross_to_the_host(pair, monkeypatch):
    """The host loop on CUDA (test_decode_device.py checks the device loop's one report per round)."""
    import cupy

    gpu = SpeculativeDecoder(*pair, device="cuda", device_rounds=False)

    reads = []
    real_to_host, real_result_to_host = decode_host.to_host, VerifyResult.to_host

    def check(array):
        # Only verify()'s outcome: accepted and emitted counts, error code and gamma+1 token ids per request.
        assert isinstance(array, cupy.ndarray) and array.size <= len(PROMPTS) * (5 + 4), array.shape
        reads.append(array.nbytes)

    def counting_to_host(array):   # sampling steps' tokens
        check(array)
        return real_to_host(array)

    def counting_result_to_host(result):   # a round's verify() result, in one copy
        check(result.packed)
        return real_result_to_host(result)

    def forbidden(*args, **kwargs):
        raise AssertionError("cupy.asnumpy called during decoding")

    monkeypatch.setattr(decode_host, "to_host", counting_to_host)
    monkeypatch.setattr(VerifyResult, "to_host", counting_result_to_host)
    monkeypatch.setattr(cupy, "asnumpy", forbidden)
    out = gpu.generate(PROMPTS, max_new_tokens=24, gamma=5, temperature=1.0, seed=1)
    assert len(reads) == out.stats["rounds"], "more than one device-to-host read per round"

    assert gpu.stream is not None and gpu.stream.ptr != 0   # one non-default stream for ORT and CuPy
    for session in (gpu.target, gpu.draft):
        binding, logits = session.last_binding()
        assert isinstance(logits, cupy.ndarray)
        # The logits output ONNX Runtime last wrote is our CuPy buffer, bound by pointer on the device.
        bound = [v for v in binding.get_outputs() if v.data_ptr() == buffer_ptr(logits)]
        assert bound and bound[0].device_name().lower() == "cuda"


def test_gpu_stats_use_cuda_events(gpu):
    stats = gpu.generate(PROMPTS, max_new_tokens=16, gamma=3, temperature=1.0).stats
    assert stats["device"] == "cuda"
    assert stats["verify_time_per_round_s"] > 0 and stats["model_time_s"] > 0
    assert stats["wall_s"] >= stats["model_time_s"]


def test_models_exported_here_run_as_cuda_graphs(gpu):
    """The pair's graphs have no CPU nodes, so both run with fixed bindings and CUDA-graph replay."""
    from specsample_cupy.runtime.sessions_static import StaticDecoderSession
    assert gpu.cuda_graphs == {"target": True, "draft": True}
    assert isinstance(gpu.target, StaticDecoderSession) and isinstance(gpu.draft, StaticDecoderSession)
    before = gpu.draft.graph_steps
    gpu.generate(PROMPTS, max_new_tokens=8, gamma=3, temperature=1.0)
    assert gpu.draft.graph_steps > before


@pytest.fixture(scope="module")
def rebinding(pair):
    return SpeculativeDecoder(*pair, device="cuda", cuda_graphs=False)


def test_static_cache_runs_give_the_logits_of_rebinding_runs(pair):
    """Session level, through holes, rollbacks and in-place compactions of the static cache: the logits of
    every real column agree with those of the growing cache rebound every run, to float rounding (keys sit
    in other slots, so sums run in another order)."""
    import cupy
    from specsample_cupy.runtime.model_folder import ModelSpec
    from specsample_cupy.runtime.sessions import DecoderSession
    from specsample_cupy.runtime.sessions_static import StaticDecoderSession

    spec = ModelSpec.from_dir(pair[0])
    stream = cupy.cuda.Stream(non_blocking=True)
    sessions = StaticDecoderSession(spec, "cuda", stream), DecoderSession(spec, "cuda", stream)
    B, rng = 3, np.random.default_rng(5)
    caches = sessions[0].new_cache(B, 64), sessions[1].new_cache(B, 64, slack=4)
    worst, compared = 0.0, 0
    for _ in range(60):
        S = int(rng.choice([1, 2, 6]))
        mask = rng.random((B, S)) < 0.8
        positions = caches[0].n_real[:, None] + np.cumsum(mask, axis=1) - 1
        ids = rng.integers(0, spec.vocab_size, (B, S))
        with stream:
            logits = [s.forward(c, ids, mask, positions).copy() for s, c in zip(sessions, caches)]
        stream.synchronize()
        diff = cupy.abs(logits[0] - logits[1])[cupy.asarray(mask)]
        if diff.size:
            worst, compared = max(worst, float(diff.max())), compared + diff.size
        keep = np.minimum(np.maximum(caches[0].n_real - rng.integers(0, 3, B), 0), 40)
        for cache in caches:
            cache.rollback(keep)
        assert (caches[0].mask.sum(axis=1) == caches[1].mask.sum(axis=1)).all()
    assert caches[0].compactions > 0 and compared > 1000
    assert worst < 1e-4, worst


def test_graph_replay_gives_the_tokens_of_rebinding_runs(gpu, rebinding):
    """Decoder level, graph replay vs rebinding: greedy chains and sampled tokens identical but for float
    near-ties (a flipped argmax changes the rest of that request)."""
    from specsample_cupy.runtime.sessions import DecoderSession
    assert type(rebinding.target) is DecoderSession and rebinding.cuda_graphs["target"] == "off"
    for kwargs in (dict(max_new_tokens=90, gamma=5, method="greedy"),
                   dict(max_new_tokens=32, gamma=4, method="exact", temperature=0.9, seed=7)):
        out = gpu.generate(PROMPTS * 4, **kwargs)
        same = np.mean([x == y for x, y in zip(out.token_ids, rebinding.generate(PROMPTS * 4, **kwargs).token_ids)])
        assert same >= 0.75, (kwargs["method"], same)
        if kwargs["method"] == "greedy":
            assert out.stats["kv_compactions"] > 0, "the long run should fill the static cache at least once"


def test_widen_ids_kernel_against_numpy():
    """kernels_cu/feeds.cu: int32 ids at any row pitch into int64 columns; negative ids feed as 0."""
    import cupy
    from specsample_cupy.runtime.sessions_static import _widen_ids
    rng = np.random.default_rng(11)
    src_full = rng.integers(-2, 50, (5, 9)).astype(np.int32)
    dst_full = np.full((5, 7), 99, np.int64)
    src, dst = cupy.asarray(src_full), cupy.asarray(dst_full)
    stream = cupy.cuda.get_current_stream()
    _widen_ids(0)(src[:, 2:6], dst[:, 3:7], 48, stream)
    expected = dst_full.copy()
    expected[:, 3:7] = np.clip(src_full[:, 2:6], 0, 47)
    assert (dst.get() == expected).all()
