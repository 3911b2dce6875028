"""The round kernels sample a long row with several blocks, one vocabulary slice each
(sample_row.cuh's sample_row_sliced, round_buffers.row_slices): the device loop's draft and target
tokens are the host loop's, which samples each row whole (verification.sampling), for greedy and
sampled steps, with truncation, at aligned (16-byte loads) and odd vocabulary sizes."""
import pytest

from helpers_convert import TINY
from helpers_decode_gpu import GPU_DECODE, same_fraction

pytestmark = GPU_DECODE

PROMPTS = ["def f(x):", "import os", "class A:\n    pass", "x = 1"]


@pytest.fixture(scope="module")
def long_rows(tmp_path_factory):
    """Converted tiny Qwen2 models with 40000 (K = 10 fp32, 5 fp16) and 40001 (scalar loads, K = 40)
    vocabulary entries, each drafting for itself."""
    from models.hf_checkpoint import write_checkpoint
    from specsample_cupy.convert import convert
    root = tmp_path_factory.mktemp("long_rows")
    folders = {}
    for V in (40000, 40001):
        hf = write_checkpoint(root / f"hf{V}", {**TINY["qwen2-tied"], "vocab_size": V, "num_hidden_layers": 2},
                              dtype="float32", seed=3, embed_scale=0.5)
        for dtype in ("float32", "float16"):
            folders[V, dtype] = convert(hf, root / f"{V}-{dtype}", dtype=dtype)
    return folders


@pytest.mark.parametrize("kwargs", [
    dict(gamma=0, method="target", temperature=1.0),
    dict(gamma=0, method="target", temperature=0.0),
    dict(gamma=3, method="greedy"),
    dict(gamma=3, method="exact", temperature=1.0),
    dict(gamma=2, method="exact", temperature=0.8, top_k=50),
])
@pytest.mark.parametrize("V,dtype", [(40000, "float32"), (40000, "float16"), (40001, "float32")])
def test_long_rows_sample_the_host_loops_tokens(long_rows, V, dtype, kwargs):
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    from specsample_cupy.decode.round_buffers import row_slices
    from specsample_cupy.verification.load_width import vec_width
    folder = long_rows[V, dtype]
    assert row_slices(V, vec_width(dtype, V)[1]) > 1
    args = dict(max_new_tokens=24, seed=5, ignore_eos=True, **kwargs)
    dev = SpeculativeDecoder(folder, folder, device="cuda").generate(PROMPTS, **args)
    host = SpeculativeDecoder(folder, folder, device="cuda", device_rounds=False).generate(PROMPTS, **args)
    assert dev.stats["loop"] == "device" and host.stats["loop"] == "host"
    assert same_fraction(dev.token_ids, host.token_ids) >= 0.75, (dev.token_ids, host.token_ids)
    assert all(len(t) == 24 and all(0 <= x < V for x in t) for t in dev.token_ids)
