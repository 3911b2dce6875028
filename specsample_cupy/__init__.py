"""specsample-cupy: speculative-sampling verification kernels (CuPy) and a speculative decoder (ONNX Runtime)."""
from specsample_cupy.runtime import errors   # the error codes verify() and generate() report
from specsample_cupy.settings import SamplingSettings
from specsample_cupy.verification.api import VerifyResult, verify
from specsample_cupy.verification.sampling import sample_tokens

__all__ = ["verify", "VerifyResult", "sample_tokens", "SpeculativeDecoder", "SamplingSettings", "errors"]


def __getattr__(name):
    # The decoder pulls in ONNX Runtime; import it only when asked for.
    if name == "SpeculativeDecoder":
        from specsample_cupy.decode.decoder import SpeculativeDecoder
        return SpeculativeDecoder
    raise AttributeError(name)
