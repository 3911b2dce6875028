"""Speculative rounds with their bookkeeping on the GPU (device_loop) against the host-driven rounds:
the same Philox offsets and the same rules, so the same tokens but for float near-ties."""
import pytest

pytest.importorskip("onnxruntime")

from specsample_cupy.decode.decoder import SpeculativeDecoder  # noqa: E402

from helpers_decode_gpu import GPU_DECODE, PROMPTS, on_device, on_host, same_fraction  # noqa: E402,F401

pytestmark = GPU_DECODE


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
    assert same_fraction(dev.token_ids, host.token_ids) >= 0.9, kwargs
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
    assert same_fraction(dev.token_ids, host.token_ids) >= 0.9
    assert dev.stats["discarded_rounds"] in (0, 1)


def _count_reads(on_device, monkeypatch, **kwargs):
    """Run generate() recording every host<->device copy and every report read of the device loop."""
    import cupy
    from specsample_cupy.decode import device_loop as decode_device, host_loop as decode_host

    copies, reads = [], []
    real_copy, real_read = cupy.cuda.runtime.memcpyAsync, decode_device.DeviceRounds._read

    def recording_copy(dst, src, size, kind, stream):
        copies.append(kind)
        return real_copy(dst, src, size, kind, stream)

    def counting_read(self, r):
        reads.append(self.buf.report_size - (self.cap - self.gammas[r]) * self.B)
        return real_read(self, r)

    def forbidden(*args, **kwargs):
        raise AssertionError("a host-driven read during device rounds")

    on_device.generate(PROMPTS, **{**kwargs, "max_new_tokens": 8})   # warm-up: plans and graphs
    monkeypatch.setattr(cupy.cuda.runtime, "memcpyAsync", recording_copy)
    monkeypatch.setattr(decode_device.DeviceRounds, "_read", counting_read)
    monkeypatch.setattr(decode_host, "to_host", forbidden)
    monkeypatch.setattr(cupy, "asnumpy", forbidden)
    out = on_device.generate(PROMPTS, **kwargs)
    return out, copies, reads


@pytest.mark.parametrize("gamma", [5, 0])
def test_device_loop_reads_one_report_per_round(on_device, monkeypatch, gamma):
    """No logits cross to the host: the host reads one report per round (verify()'s packed result, or
    the target step's, and three more ints per request, written into page-locked host memory), makes
    no device-to-host copy, and never uses the host loop's read. gamma = 0 is target-only decoding:
    one report per token step."""
    method = "exact" if gamma else "target"
    out, copies, reads = _count_reads(on_device, monkeypatch, max_new_tokens=70, gamma=gamma, method=method,
                                      temperature=1.0, seed=1)
    B = len(PROMPTS)
    assert out.stats["device_rounds"] is True and (gamma == 0 or out.stats["kv_compactions"] > 0)
    assert 2 not in copies, "a device-to-host copy during device rounds"
    assert len(reads) == out.stats["rounds"]
    assert set(reads) == {3 * B + B * (gamma + 1) + 3 * B}
    if gamma == 0:
        assert out.stats["rounds"] >= 70 and out.stats["method"] == "target"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_target_only_device_loop_gives_the_host_loops_tokens(on_device, on_host, temperature):
    """target_step_done samples with sample_tokens' Philox stream at offset = step: the host loop's tokens."""
    kwargs = dict(max_new_tokens=50, gamma=0, method="target", temperature=temperature, seed=11)
    dev, host = on_device.generate(PROMPTS * 2, **kwargs), on_host.generate(PROMPTS * 2, **kwargs)
    assert dev.stats["loop"] == "device" and host.stats["loop"] == "host"
    assert same_fraction(dev.token_ids, host.token_ids) >= 0.9


@pytest.mark.parametrize("gamma,extra", [(1, {}), (4, {}), (3, {"adaptive_gamma": True}), ("auto", {})])
def test_greedy_device_loop_equals_target_only_greedy(on_device, gamma, extra):
    """Greedy speculative decoding on the device loop, at fixed, adaptive and automatic gamma, gives
    target-only greedy decoding's tokens (also on the device loop)."""
    expected = on_device.generate(PROMPTS, max_new_tokens=60, method="target", temperature=0).token_ids
    out = on_device.generate(PROMPTS, max_new_tokens=60, gamma=gamma, method="greedy", **extra)
    assert out.stats["loop"] == "device"
    assert same_fraction(out.token_ids, expected) >= 0.75 and sum(a == b for a, b in zip(out.token_ids, expected)) >= 3
    if gamma == "auto":   # (its rounds may be target steps: the tiny pair's drafts do not pay on a GPU)
        assert out.stats["gamma_mode"] == "auto" and 0 <= out.stats["mean_gamma"] <= 12


def test_ignore_eos_generates_the_budget_on_the_device(on_device):
    for method, gamma in (("target", 0), ("exact", 3), ("greedy", "auto")):
        out = on_device.generate(PROMPTS, max_new_tokens=40, gamma=gamma, method=method, seed=5, ignore_eos=True)
        assert [len(t) for t in out.token_ids] == [40] * len(PROMPTS), method
        assert out.finish_reasons == ["length"] * len(PROMPTS)


def test_device_loop_stops_a_request_from_the_round_hook(on_device):
    """on_round may finish requests (stop strings): the host stops taking their tokens at once."""
    def stop_first(rnd, req):
        return [0] if req.seq_len[0] - req.prompt_len[0] >= 5 else None

    out = on_device.generate(PROMPTS, max_new_tokens=40, gamma=3, method="greedy", on_round=stop_first,
                             ignore_eos=True)
    assert out.finish_reasons[0] == "stop" and 5 <= len(out.token_ids[0]) <= 9
    assert [len(t) for t in out.token_ids[1:]] == [40] * (len(PROMPTS) - 1)
