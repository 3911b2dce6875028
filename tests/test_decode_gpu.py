"""The decoder on the GPU: same tokens as on the CPU, and logits that never leave the device."""
import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from specsample_cupy import decoder as decoder_module  # noqa: E402
from specsample_cupy.decoder import SpeculativeDecoder  # noqa: E402
from specsample_cupy.sessions import cuda_available  # noqa: E402
from specsample_cupy.sessions_cache import buffer_ptr  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_available(),
                       reason="needs CuPy, a CUDA device and onnxruntime-gpu's CUDAExecutionProvider"),
]

PROMPTS = ["the rain in spain", "a", "hello there, a longer prompt", "sea"]


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


def test_no_logits_cross_to_the_host(gpu, monkeypatch):
    import cupy

    reads = []
    real_to_host = decoder_module._to_host

    def counting_to_host(array):
        # Only verify()'s outcome: accepted and emitted counts, error code and gamma+1 token ids per request.
        assert isinstance(array, cupy.ndarray) and array.size <= len(PROMPTS) * (5 + 4), array.shape
        reads.append(array.nbytes)
        return real_to_host(array)

    def forbidden(*args, **kwargs):
        raise AssertionError("cupy.asnumpy called during decoding")

    monkeypatch.setattr(decoder_module, "_to_host", counting_to_host)
    monkeypatch.setattr(cupy, "asnumpy", forbidden)
    out = gpu.generate(PROMPTS, max_new_tokens=24, gamma=5, temperature=1.0, seed=1)
    assert len(reads) == out.stats["rounds"], "more than one device-to-host read per round"

    assert gpu.stream is not None and gpu.stream.ptr != 0   # one non-default stream for ORT and CuPy
    for session in (gpu.target, gpu.draft):
        assert isinstance(session._logits_buffer, cupy.ndarray)
        # The logits output ONNX Runtime last wrote is our CuPy buffer, bound by pointer on the device.
        bound = [v for v in session._binding.get_outputs() if v.data_ptr() == buffer_ptr(session._logits_buffer)]
        assert bound and bound[0].device_name().lower() == "cuda"


def test_gpu_stats_use_cuda_events(gpu):
    stats = gpu.generate(PROMPTS, max_new_tokens=16, gamma=3, temperature=1.0).stats
    assert stats["device"] == "cuda"
    assert stats["verify_time_per_round_s"] > 0 and stats["model_time_s"] > 0
    assert stats["wall_s"] >= stats["model_time_s"]
