"""sample_tokens(): one token per row from softmax(logits / T), with the verifier's Philox stream.

It draws what verify() draws with gamma = 0 (the bonus-token path: an exponential race over the
row), keyed by its own purpose so it never reuses verify's random numbers for the same (seed,
offset). On CuPy, rows up to ROW_SAMPLER_MAX_V long use kernels_cu/sample_rows.cu.
"""
import ctypes
import functools
from numbers import Real


from specsample_cupy.runtime import kernel_runtime
from specsample_cupy.runtime.philox import PURPOSE_SAMPLE
from specsample_cupy.verification.api import verify

_NO_DRAFTS = {}


def sample_tokens(logits, *, temperature=1.0, seed=0, offset=0, top_k=None, top_p=None, min_p=None,
                  warps=None, logits_dtype=None, streams=None, _out=None):
    """Sample ids from logits [B, V] (NumPy or CuPy, float32/float16/bfloat16).

    temperature: scalar or [B]; 0 takes the argmax (first index on ties).
    top_k, top_p, min_p: truncated sampling, as verify() (None, a scalar or [B] each).
    warps: (advanced) that truncation prebuilt for these B, V and temperature, as verify()'s `warps`
        (specsample_cupy.verification.truncation.build_warps; a draft loop samples with the same warps every step).
    streams: None or [B, 2] int64 per-request (seed, offset), as verify()'s: row b then draws what
        a one-row call with seed=streams[b, 0], offset=streams[b, 1] draws (seed, offset ignored).
    Returns [B] int32 of the input's module; on CuPy, rows with NaN/+Inf logits give -1 and rows
    with no finite logit -2 (callers check: host_loop raises, device_loop reports an error).
    (_out: the decoder's reused int32 buffer of 4B elements for the fast path; the result is a view
    of it that the next call overwrites.)
    """
    if logits.ndim != 2:
        raise ValueError(f"logits must be [B, V], got shape {logits.shape}")
    B, V = logits.shape
    module = type(logits).__module__.split(".")[0]
    warped = warps is not None or top_k is not None or top_p is not None or min_p is not None
    if (module == "cupy" and not warped and logits.dtype.char in "fe" and logits.flags.c_contiguous
            and logits_dtype is None
            and isinstance(temperature, (float, int, Real)) and 0 <= temperature < float("inf")
            and isinstance(seed, int) and isinstance(offset, int) and _fast_streams(streams, B)):
        return _sample_on_gpu(logits, float(temperature), seed, offset, _out, streams)
    return sample_result(logits, temperature=temperature, seed=seed, offset=offset, top_k=top_k, top_p=top_p,
                         min_p=min_p, warps=warps, logits_dtype=logits_dtype, streams=streams).tokens[:, 0]


def sample_result(logits, *, logprobs=False, **kwargs):
    """What sample_tokens() draws, as verify()'s result with gamma = 0 (tokens [B, 1]; logprobs=True:
    also each token's log-probability). Keyword arguments as sample_tokens(); always verify()'s path."""
    xp = __import__(type(logits).__module__.split(".")[0])
    B, V = logits.shape
    return verify(xp.zeros((B, 0), xp.int32), xp.empty((B, 0, V), logits.dtype), logits[:, None, :],
                  logprobs=logprobs, _race_purpose=PURPOSE_SAMPLE, **kwargs)


def _fast_streams(streams, B) -> bool:
    """Streams the fast path reads as they are: none, or a C-contiguous [B, 2] int64 CuPy array
    (anything else goes through verify(), which checks it and says what is wrong)."""
    return streams is None or (type(streams).__module__.split(".")[0] == "cupy" and streams.shape == (B, 2)
                               and streams.dtype.char in "lq" and streams.dtype.itemsize == 8
                               and streams.flags.c_contiguous)


ROW_SAMPLER_MAX_V = 32768   # rows up to this long: kernels_cu/sample_rows.cu, one block per row


class _RowSampler:
    """kernels_cu/sample_rows.cu through a kernel_runtime.Launch; one per (device, dtype, vector width),
    shared by every thread (the Launch serialises their calls)."""

    def __init__(self, tag, vec):
        kernel, = kernel_runtime.functions("sample_rows.cu", (f"sample_rows_kernel<{tag}, {vec}>",))
        c = ctypes
        self.launch = kernel_runtime.Launch(kernel, [
            c.c_void_p(), c.c_int32(), c.c_float(), c.c_uint64(), c.c_uint32(), c.c_uint32(PURPOSE_SAMPLE),
            ("streams", c.c_void_p()), ("tokens", c.c_void_p())])

    def __call__(self, logits, temperature, seed, offset, tokens, stream, streams=None):
        B, V = logits.shape
        self.launch(stream, B, 256, leading=(logits.data.ptr, V, temperature, seed & 0xFFFFFFFFFFFFFFFF,
                                             offset & 0xFFFFFFFF),
                    streams=0 if streams is None else streams.data.ptr, tokens=tokens.data.ptr)


@functools.lru_cache(maxsize=None)
def _row_sampler(device_id, tag, vec):
    return _RowSampler(tag, vec)


def _sample_on_gpu(logits, temperature, seed, offset, out=None, streams=None):
    """The draft samples once per proposed token, so this path is on the decoder's critical path:
    rows up to ROW_SAMPLER_MAX_V long take one block each (one launch, no hand-off between blocks);
    longer rows the verification kernel with gamma = 0. No general validation here."""
    import cupy
    from specsample_cupy.verification import kernel_launch as kernels
    B, V = logits.shape
    if V <= ROW_SAMPLER_MAX_V:
        tag = "f32" if logits.dtype.char == "f" else "f16"
        vec = 16 // logits.itemsize
        if V % vec or logits.data.ptr % 16:
            vec = 1
        if out is None or out.size != 4 * B:
            out = cupy.empty(4 * B, cupy.int32)
        tokens = out[3 * B:]
        _row_sampler(cupy.cuda.runtime.getDevice(), tag, vec)(logits, temperature, seed, offset, tokens,
                                                               cupy.cuda.get_current_stream(), streams)
        return tokens
    key = (cupy.cuda.runtime.getDevice(), B)
    no_drafts = _NO_DRAFTS.get(key)
    if no_drafts is None:
        no_drafts = _NO_DRAFTS[key] = cupy.zeros((B, 0), cupy.int32)
    rows = logits.reshape(B, 1, V)
    out = kernels.launch(no_drafts, rows, rows, dtype_name="float32" if logits.dtype.char == "f" else "float16",
                         lengths=None, temps=None, temp_scalar=temperature, seed=seed, offset=offset,
                         mode=kernels.MODE_LOGITS, sigmoid_offset=0.0, sigmoid_scale=1.0,
                         race_purpose=PURPOSE_SAMPLE, out=out, streams=streams)
    return out[3 * B:]
