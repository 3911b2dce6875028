"""What the GPU decoding tests share: their marks, prompts, the device-loop and host-loop decoders of
the module's `pair` on CUDA, and how alike two runs' tokens are."""
import numpy as np
import pytest

from specsample_cupy.runtime.ort_session import cuda_available

GPU_DECODE = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_available(),
                       reason="needs CuPy, a CUDA device and onnxruntime-gpu's CUDAExecutionProvider"),
]

PROMPTS = ["the rain in spain", "a", "hello there, a longer prompt", "sea"]


@pytest.fixture(scope="module")
def on_device(pair):
    """The module's pair on CUDA, decoding with the device loop."""
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    return SpeculativeDecoder(*pair, device="cuda")


@pytest.fixture(scope="module")
def on_host(pair):
    """The module's pair on CUDA, decoding with the host loop."""
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    return SpeculativeDecoder(*pair, device="cuda", device_rounds=False)


def same_fraction(a, b) -> float:
    """The share of requests whose token lists are identical."""
    return float(np.mean([x == y for x, y in zip(a, b)]))
