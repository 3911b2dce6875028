"""sample_tokens(): one token per row from softmax(logits / T), with the verifier's Philox stream.

It is verify() with gamma = 0 (the bonus-token path: an exponential race over the row), keyed by
its own purpose so it never reuses verify's random numbers for the same (seed, offset).
"""
from specsample_cupy.philox import PURPOSE_SAMPLE
from specsample_cupy.verify import verify


def sample_tokens(logits, *, temperature=1.0, seed=0, offset=0, logits_dtype=None):
    """Sample ids from logits [B, V] (NumPy or CuPy, float32/float16/bfloat16).

    temperature: scalar or [B]; 0 takes the argmax (first index on ties).
    Returns [B] int32 of the input's module; on CuPy, rows with NaN/+Inf logits give -1.
    """
    if logits.ndim != 2:
        raise ValueError(f"logits must be [B, V], got shape {logits.shape}")
    B, V = logits.shape
    xp = __import__(type(logits).__module__.split(".")[0])
    res = verify(xp.zeros((B, 0), xp.int32), xp.empty((B, 0, V), logits.dtype), logits[:, None, :],
                 temperature=temperature, seed=seed, offset=offset, logits_dtype=logits_dtype,
                 _race_purpose=PURPOSE_SAMPLE)
    return res.tokens[:, 0]
