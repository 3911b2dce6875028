"""Speculative rounds with their bookkeeping on the GPU (decode_device) against the host-driven rounds:
the same Philox offsets and the same rules, so the same tokens but for float near-ties."""
import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from specsample_cupy import decoder as decoder_module  # noqa: E402
from specsample_cupy.decoder import SpeculativeDecoder  # noqa: E402

from helpers_decode_gpu import GPU_DECODE, PROMPTS  # noqa: E402

pytestmark = GPU_DECODE


@pytest.fixture(scope="module")
def on_device(pair):
    return SpeculativeDecoder(*pair, device="cuda")


@pytest.fixture(scope="module")
def on_host(pair):
    return SpeculativeDecoder(*pair, device="cuda", device_rounds=False)


def _same(a, b) -> float:
    return float(np.mean([x == y for x, y in zip(a, b)]))


@pytest.mark.parametrize("kwargs", [
    dict(max_new_tokens=90, gamma=5, method="greedy"),
    dict(max_new_tokens=60, gamma=1, method="greedy"),
    dict(max_new_tokens=40, gamma=4, method="exact", temperature=0.9, seed=7),
    dict(max_new_tokens=40, gamma=3, method="sigmoid", temperature=1.0, seed=8),
    dict(max_new_tokens=33, gamma=2, method="exact", temperature=0.7, seed=9),
])
def test_device_rounds_give_the_tokens_of_host_rounds(on_device, on_host, kwargs):
    """Same draft samples, same verify() draws, same EOS/budget cuts and rollbacks; a float near-tie
    (the target run covers gamma + 1 columns on both paths, the draft's first run 2 columns on the
    device path and 1 or 2 on the host's) may flip one request's continuation."""
    prompts = PROMPTS * 3
    dev = on_device.generate(prompts, **kwargs)
    host = on_host.generate(prompts, **kwargs)
    assert dev.stats["device_rounds"] is True and host.stats["device_rounds"] == "off"
    assert _same(dev.token_ids, host.token_ids) >= 0.9, kwargs
    assert all(len(t) == kwargs["max_new_tokens"] for t in dev.token_ids if 0 not in t)
    if kwargs["max_new_tokens"] >= 60:
        assert dev.stats["kv_compactions"] > 0, "the long run should fill the static cache at least once"
    for key in ("rounds", "proposed", "accepted"):
        assert abs(dev.stats[key] - host.stats[key]) <= 0.1 * host.stats[key] + 2, key


def test_device_rounds_run_the_baseline(on_device):
    """baseline draws from a stateful generator (as Hugging Face's does), so its tokens are not
    comparable between two calls; its exactness is tested on the CPU. Here: it runs every request
    to its budget through device rounds, with ids in the vocabulary."""
    out = on_device.generate(PROMPTS, max_new_tokens=30, gamma=3, method="baseline", temperature=0.8, seed=4)
    assert out.stats["device_rounds"] is True and 0 < out.stats["acceptance_rate"] < 1
    for ids in out.token_ids:
        assert all(0 <= t < on_device.target.vocab_size for t in ids)
        assert len(ids) == 30 or ids[-1] == 0


def test_device_rounds_stop_each_request_at_its_eos(pair):
    """Three frequent ids declared EOS: requests end in different rounds, each right after its first EOS,
    and the rounds enqueued ahead of a read that found every request done are counted, not emitted."""
    decoders = [SpeculativeDecoder(*pair, device="cuda", device_rounds=flag) for flag in (True, False)]
    eos = (0, 5, 7)
    for dec in decoders:
        dec.target_spec.eos_token_ids = eos
    kwargs = dict(max_new_tokens=64, gamma=4, method="exact", temperature=1.0, seed=3)
    dev, host = (dec.generate(PROMPTS * 4, **kwargs) for dec in decoders)
    lengths = {len(t) for t in dev.token_ids}
    assert len(lengths) > 3, lengths
    for ids in dev.token_ids:
        ends = [j for j, t in enumerate(ids) if t in eos]
        assert ends == [] and len(ids) == 64 or ends == [len(ids) - 1]
    assert _same(dev.token_ids, host.token_ids) >= 0.9
    assert dev.stats["discarded_rounds"] in (0, 1)


def test_device_rounds_read_one_report_per_round(on_device, monkeypatch):
    """No logits cross to the host: the host reads one report per round (verify()'s packed result and
    two more ints per request, which round_done writes into page-locked host memory), makes no
    device-to-host copy, and never uses the host-driven read."""
    import cupy
    from specsample_cupy import decode_device

    copies, reads = [], []
    real_copy, real_read = cupy.cuda.runtime.memcpyAsync, decode_device.DeviceRounds._read

    def recording_copy(dst, src, size, kind, stream):
        copies.append(kind)
        return real_copy(dst, src, size, kind, stream)

    def counting_read(self, r):
        reads.append(self.host_reports[r % 2].nbytes)
        return real_read(self, r)

    def forbidden(*args, **kwargs):
        raise AssertionError("a host-driven read during device rounds")

    on_device.generate(PROMPTS, max_new_tokens=8, gamma=5, seed=1)   # warm-up: plans and graphs
    monkeypatch.setattr(cupy.cuda.runtime, "memcpyAsync", recording_copy)
    monkeypatch.setattr(decode_device.DeviceRounds, "_read", counting_read)
    monkeypatch.setattr(decoder_module, "_to_host", forbidden)
    monkeypatch.setattr(cupy, "asnumpy", forbidden)
    out = on_device.generate(PROMPTS, max_new_tokens=70, gamma=5, temperature=1.0, seed=1)
    B, G = len(PROMPTS), 5
    assert out.stats["kv_compactions"] > 0 and out.stats["device_rounds"] is True
    assert 2 not in copies, "a device-to-host copy during device rounds"
    assert len(reads) == out.stats["rounds"]
    assert set(reads) == {4 * (3 * B + B * (G + 1) + 2 * B)}


def test_device_rounds_refuse_what_they_cannot_do(on_device):
    """Adaptive gamma changes gamma from one round's result, which device rounds enqueue before
    reading: that case, and target-only decoding, take the host-driven loop and say so."""
    out = on_device.generate(PROMPTS, max_new_tokens=12, gamma=2, adaptive_gamma=True, seed=2)
    assert out.stats["device_rounds"] == "adaptive gamma"
    assert on_device.generate(PROMPTS, max_new_tokens=4, method="target").stats["device_rounds"] == "target only"
