"""What the GPU decoding tests share: their marks and prompts."""
import pytest

from specsample_cupy.sessions import cuda_available

GPU_DECODE = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_available(),
                       reason="needs CuPy, a CUDA device and onnxruntime-gpu's CUDAExecutionProvider"),
]

PROMPTS = ["the rain in spain", "a", "hello there, a longer prompt", "sea"]
