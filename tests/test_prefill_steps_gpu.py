"""Prefill runs of CUDA-graph sessions write their logits to one buffer per plan: prompts of many lengths
leave the loop's own bindings at the step counts the loop runs (each with its own logits) and every
prefill binding a view of the plan's one prefill buffer, and decode the same tokens as the CPU (device
loop, host loop, continuous batching's in-place refills)."""
import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from specsample_cupy.decode.continuous import StreamRequest  # noqa: E402
from specsample_cupy.decode.decoder import SpeculativeDecoder  # noqa: E402
from specsample_cupy.runtime.sessions_static import MAX_GRAPH_STEPS  # noqa: E402

from helpers_decode_gpu import GPU_DECODE  # noqa: E402

pytestmark = GPU_DECODE

GAMMA = 3
# Prompts of many token counts, so that prefill runs of many step counts happen.
PROMPTS = ["the rain" + " in spain" * k for k in range(9)]


def _plans(dec):
    return [(role, plan) for role, session in (("target", dec.target), ("draft", dec.draft))
            for plan in session._plans.values()]


def _check_plans(dec):
    """The loop's runs (at most gamma + 1 columns) keep their own bindings; every prefill binding is a
    view of its plan's one buffer, and prefills of several lengths, longer than any loop run, happened."""
    prefilled = set()
    for role, plan in _plans(dec):
        assert max(plan.steps, default=0) <= GAMMA + 1, (role, sorted(plan.steps))
        V = plan.prefill_logits.size // (plan.batch * MAX_GRAPH_STEPS) if plan.prefill_steps else None
        for S, step in plan.prefill_steps.items():
            assert step.logits.data.ptr == plan.prefill_logits.data.ptr, (role, S)
            assert step.logits.shape == (plan.batch, S, V)
        prefilled |= set(plan.prefill_steps)
    assert max(prefilled) > GAMMA + 1 and len(prefilled) >= 2, sorted(prefilled)


@pytest.fixture(scope="module")
def cpu(pair):
    return SpeculativeDecoder(*pair, device="cpu")


@pytest.mark.parametrize("device_rounds", [True, False], ids=["device-loop", "host-loop"])
def test_prefill_runs_share_one_logits_buffer_and_decode_as_the_cpu(pair, cpu, device_rounds):
    dec = SpeculativeDecoder(*pair, device="cuda", device_rounds=device_rounds)
    expected = cpu.generate(PROMPTS, max_new_tokens=24, gamma=GAMMA, method="greedy").token_ids
    # One prompt at a time (a plan per batch size 1: every length's prefill in it), then all at once.
    for prompt, want in zip(PROMPTS, expected):
        assert dec.generate([prompt], max_new_tokens=24, gamma=GAMMA, method="greedy").token_ids == [want]
    assert dec.generate(PROMPTS, max_new_tokens=24, gamma=GAMMA, method="greedy").token_ids == expected
    # The loop's runs: the target's gamma + 1 columns and its single-column step, the draft's 1 and 2.
    _check_plans(dec)


def test_continuous_refills_prefill_into_the_shared_buffer(pair, cpu):
    requests = [StreamRequest(p, 6 + 3 * (i % 4), 0.0, i) for i, p in enumerate(PROMPTS * 2)]
    on = {}
    for device, dec in (("cuda", SpeculativeDecoder(*pair, device="cuda")), ("cpu", cpu)):
        on[device] = {r.index: r.token_ids for r in dec.generate_stream(requests, batch_size=3, gamma=GAMMA)}
        if device == "cuda":
            _check_plans(dec)
    assert sorted(on["cuda"]) == list(range(len(requests)))
    # Identical up to a float near-tie between batched runs on the two devices (as the other tests allow).
    same = np.mean([on["cuda"][i] == on["cpu"][i] for i in range(len(requests))])
    assert same >= 0.9, f"only {same:.0%} of requests identical on GPU and CPU"
