"""generate() with top_k / top_p / min_p and logprobs (on CPU and CUDA; test_decode_truncation_device
compares CUDA's device loop with its host loop), and the CLI's
--top-k / --top-p / --min-p / --logprobs."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from specsample_cupy.decode.decoder import SpeculativeDecoder

DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)]
PROMPTS = ["import os\n", "def f(x):\n    return", "class A:"]


@pytest.fixture(scope="module")
def decoders():
    return {}


def _decoder(decoders, device):
    if device not in decoders:
        decoders[device] = SpeculativeDecoder(device=device)
    return decoders[device]


@pytest.mark.parametrize("device", DEVICES)
def test_top_k_1_is_greedy(decoders, device):
    dec = _decoder(decoders, device)
    greedy = dec.generate(PROMPTS, max_new_tokens=16, gamma=3, method="greedy")
    top1 = dec.generate(PROMPTS, max_new_tokens=16, gamma=3, temperature=1.0, top_k=1, seed=5)
    assert top1.token_ids == greedy.token_ids
    assert top1.stats["loop"] == ("host" if device == "cpu" else "device")   # CUDA: the device loop


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gamma", [0, 3])
def test_logprobs_follow_the_tokens(decoders, device, gamma):
    """One finite log-probability <= 0 per generated token; truncation never emits a token outside the
    kept set (its log-probability would be -inf); the same seed gives the same tokens with or without
    logprobs."""
    dec = _decoder(decoders, device)
    kw = dict(max_new_tokens=16, gamma=gamma, temperature=0.8, seed=7, top_k=8, top_p=0.7,
              method="exact" if gamma else "target")
    out = dec.generate(PROMPTS, logprobs=True, **kw)
    plain = dec.generate(PROMPTS, **kw)
    assert out.token_ids == plain.token_ids
    for lp, ids in zip(out.logprobs, out.token_ids):
        assert len(lp) == len(ids) and all(np.isfinite(lp)) and max(lp) <= 1e-6


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_logprobs_equal_target_only(decoders, device):
    dec = _decoder(decoders, device)
    spec = dec.generate(PROMPTS, max_new_tokens=12, gamma=4, method="greedy", logprobs=True)
    alone = dec.generate(PROMPTS, max_new_tokens=12, gamma=0, method="target", temperature=0, logprobs=True)
    assert spec.token_ids == alone.token_ids
    for a, b in zip(spec.logprobs, alone.logprobs):
        np.testing.assert_allclose(a, b, atol=1e-4)


@pytest.mark.gpu
def test_cuda_matches_cpu(decoders):
    cpu, gpu = _decoder(decoders, "cpu"), _decoder(decoders, "cuda")
    kw = dict(max_new_tokens=16, gamma=3, temperature=0.7, seed=11, top_p=0.9, min_p=0.05, logprobs=True)
    a, b = cpu.generate(PROMPTS, **kw), gpu.generate(PROMPTS, **kw)
    assert a.token_ids == b.token_ids
    for x, y in zip(a.logprobs, b.logprobs):
        np.testing.assert_allclose(x, y, atol=2e-3)


def test_the_host_loop_builds_its_warps_once(pair, monkeypatch):
    """The host loop builds the truncation's Warps once per generate() (and once per refill of
    continuous batching, whose temperatures change) and passes them to every sample_tokens() and
    verify() call; its tokens and log-probabilities are bit for bit those of the calls building them."""
    import importlib
    from specsample_cupy.decode import host_loop as decode_host
    from specsample_cupy.decode.continuous import StreamRequest
    verify_module = importlib.import_module("specsample_cupy.verification.api")
    dec = SpeculativeDecoder(*pair, device="cpu")
    builds, per_call = [], []
    real_build, real_make = decode_host.build_warps, verify_module.make_warps
    monkeypatch.setattr(decode_host, "build_warps", lambda *a, **k: builds.append(a[3]) or real_build(*a, **k))
    monkeypatch.setattr(verify_module, "make_warps", lambda *a, **k: per_call.append(1) or real_make(*a, **k))
    trunc = dict(top_k=10, top_p=0.9, min_p=0.05)
    requests = [StreamRequest(p, max_new_tokens=n, temperature=t, seed=i)
                for i, (p, n, t) in enumerate(zip(PROMPTS * 2, (9, 4, 12, 6, 3, 8), (0.8, 1.3, 0.0, 0.5, 1.0, 0.7)))]

    def run():
        calls = {gamma: dec.generate(PROMPTS, max_new_tokens=12, gamma=gamma, temperature=0.8, seed=3,
                                     method="exact" if gamma else "target", logprobs=True, **trunc)
                 for gamma in (3, 0)}
        stream = sorted(dec.generate_stream(requests, batch_size=2, gamma=3, logprobs=True, **trunc),
                        key=lambda r: r.index)
        return ([(o.token_ids, o.logprobs) for o in calls.values()],
                [(r.token_ids, r.logprobs) for r in stream])

    prebuilt = run()
    assert not per_call
    assert len(builds) == 2 + 1 + (len(requests) - 2)   # each generate(); the stream's start and refills
    monkeypatch.setattr(decode_host.HostRounds, "_warps_for", lambda self, temperature: dict(self.truncation))
    assert run() == prebuilt and per_call


def test_bad_values_raise(decoders):
    dec = _decoder(decoders, "cpu")
    for kw, arg in ((dict(top_p=0.0), "top_p"), (dict(top_k=-1), "top_k"), (dict(min_p=2.0), "min_p")):
        with pytest.raises(ValueError, match=arg):
            dec.generate(["a"], max_new_tokens=2, **kw)
    with pytest.raises(ValueError, match="sigmoid"):
        dec.generate(["a"], max_new_tokens=2, method="sigmoid", top_k=3)
    with pytest.raises(ValueError, match="baseline"):
        dec.generate(["a"], max_new_tokens=2, method="baseline", logprobs=True)


def test_cli_decode_logprobs_and_truncation():
    from cli import main as cli
    runner = CliRunner()
    res = runner.invoke(cli, ["decode", "--device", "cpu", "--prompt", "import os", "--prompt", "x = ",
                              "--max-new-tokens", "5", "--top-k", "10", "--min-p", "0.01", "--logprobs", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert [len(lp) for lp in out["logprobs"]] == [len(t) for t in out["token_ids"]] == [5, 5]
    res = runner.invoke(cli, ["decode", "--device", "cpu", "--prompt", "a", "--max-new-tokens", "3", "--logprobs",
                              "--jsonl", "--no-stats"])
    assert res.exit_code == 0, res.output
    line = json.loads(res.stdout.splitlines()[0])
    assert len(line["logprobs"]) == len(line["token_ids"]) == 3
    res = runner.invoke(cli, ["decode", "--device", "cpu", "--prompt", "a", "--logprobs"])
    assert res.exit_code == 2 and "--json" in res.output
    res = runner.invoke(cli, ["decode", "--device", "cpu", "--prompt", "a", "--top-p", "1.5"])
    assert res.exit_code == 2


def test_cli_generate_truncation(tmp_path):
    from cli import main as cli
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text('{"id": "a", "prompt": "import os"}\n{"id": "b", "prompt": "def f():"}\n')
    args = ["generate", "--input", str(src), "--output", str(dst), "--device", "cpu", "--max-new-tokens", "6",
            "--no-progress", "--temperature", "1", "--top-k", "1"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    lines = {json.loads(x)["id"]: json.loads(x) for x in dst.read_text().splitlines()}
    greedy = SpeculativeDecoder(device="cpu").generate(["import os", "def f():"], max_new_tokens=6, method="greedy")
    assert [lines["a"]["token_ids"], lines["b"]["token_ids"]] == greedy.token_ids
