"""Progress of the verification kernel does not depend on how many of its blocks are resident.

Blocks take work items in order from a ticket counter (kernels_cu/verify.cu), so two verifications
running at once on two streams, a grid four times larger than the GPU holds and a one-block grid
must all finish and give exactly the results of the default plan (the grid changes which block runs
an item, never what it computes). Each wait is bounded: a hang fails the test instead of stalling it.
"""
import numpy as np
import pytest

from helpers_verify import random_problem, softmax, wait_or_fail
from specsample_cupy import verify

pytestmark = pytest.mark.gpu

TIMEOUT_S = 60


def _problem(seed, B=64, G=5, V=32000, probs=False):
    import cupy as cp
    rng = np.random.default_rng(seed)
    tokens, draft, target = random_problem(rng, B, G, V, scale=2.0, closeness=0.7)
    if probs:
        draft, target = softmax(draft.astype(np.float64)), softmax(target.astype(np.float64))
    lengths = rng.integers(0, G + 1, B).astype(np.int32)
    return (cp.asarray(tokens.astype(np.int32)), cp.asarray(draft.astype(np.float32)),
            cp.asarray(target.astype(np.float32)), cp.asarray(lengths))


def _call(problem, method, probs, seed, plan=None):
    tokens, draft, target, lengths = problem
    return verify(tokens, draft, target, method=method, probs=probs, seed=seed, offset=3, draft_lengths=lengths,
                  plan=plan)


def _finished(what):
    import cupy as cp
    ev = cp.cuda.Event()
    ev.record()
    wait_or_fail([ev], TIMEOUT_S, what)


@pytest.mark.parametrize("method, probs", [("exact", False), ("exact", True), ("sigmoid", False),
                                           ("sigmoid-paper", False), ("greedy", False)])
def test_two_streams_at_once_match_sequential(method, probs):
    import cupy as cp
    problems = [_problem(10 + k, probs=probs) for k in range(2)]
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    # Sequential: one stream after the other, each fully finished.
    sequential = []
    for k, s in enumerate(streams):
        with s:
            out = _call(problems[k], method, probs, seed=k).packed.copy()
            _finished(f"sequential call {k}")
        sequential.append(out.get())
    # Concurrent: both streams fed without waiting, several rounds, each plan sized to the whole GPU
    # (so the two grids together are twice what fits: blocks of one wait for the other's to leave).
    results, events = [], []
    for _ in range(8):
        for k, s in enumerate(streams):
            with s:
                results.append((k, _call(problems[k], method, probs, seed=k).packed.copy()))
                ev = cp.cuda.Event()
                ev.record(s)
                events.append(ev)
    wait_or_fail(events, TIMEOUT_S, "concurrent calls on two streams")
    for k, out in results:
        np.testing.assert_array_equal(out.get(), sequential[k])


@pytest.mark.parametrize("method, probs", [("exact", False), ("exact", True), ("sigmoid", False), ("greedy", False),
                                           ("sigmoid-paper", False), ("greedy", True)])
def test_oversubscribed_and_single_block_grids_match_the_default_plan(method, probs):
    from specsample_cupy.verification.kernel_launch import (MODE_LOGITS, MODE_PROBS, MODE_SIGMOID,
                                                            MODE_SIGMOID_PAPER, PlanOptions, plan_info)
    problem = _problem(20, probs=probs)
    mode = MODE_PROBS if probs else {"sigmoid": MODE_SIGMOID, "sigmoid-paper": MODE_SIGMOID_PAPER}.get(method, MODE_LOGITS)
    info = plan_info(*problem[:3], dtype_name="float32", mode=mode)
    assert info["grid"] <= info["capacity"]
    default = _call(problem, method, probs, seed=4).packed.copy()
    _finished("default plan")
    plans = [PlanOptions(grid=4 * info["capacity"]), PlanOptions(grid=1), PlanOptions(lag_waves=0),
             PlanOptions(grid=3, lag_waves=0)]
    for plan in plans:
        forced = plan_info(*problem[:3], dtype_name="float32", mode=mode, options=plan)
        assert (forced["S1"], forced["C1"], forced["S2"], forced["C2"]) == \
            (info["S1"], info["C1"], info["S2"], info["C2"]), (plan, forced, info)
        for repeat in range(3):    # the workspace's counters must be back at zero after every call
            out = _call(problem, method, probs, seed=4, plan=plan).packed.copy()
            _finished(f"{plan} call {repeat}")
            np.testing.assert_array_equal(out.get(), default.get(), err_msg=f"{plan} call {repeat}")


def test_oversubscribed_grid_on_small_items_matches():
    """Many small items (one sweep each) and more blocks than fit: P2 blocks wait on P1 items that
    later-starting blocks hold, which the ticket order makes safe."""
    from specsample_cupy.verification.kernel_launch import MODE_LOGITS, PlanOptions, plan_info
    problem = _problem(30, B=256, G=8, V=4096)
    base = PlanOptions(p1_sweeps=1, p2_sweeps=1)
    info = plan_info(*problem[:3], dtype_name="float32", mode=MODE_LOGITS, options=base)
    default = _call(problem, "exact", False, seed=6, plan=base).packed.copy()
    for grid in (4 * info["capacity"], 1, 7):
        out = _call(problem, "exact", False, seed=6, plan=PlanOptions(p1_sweeps=1, p2_sweeps=1, grid=grid)).packed
        _finished(f"grid {grid}")
        np.testing.assert_array_equal(out.get(), default.get(), err_msg=f"grid {grid}")


def test_occupancy_counts_the_dynamic_shared_memory():
    """The default grid never exceeds what fits with the launch's dynamic shared memory: a large
    gamma makes the per-request row statistics (12 bytes a row) sizeable."""
    import cupy as cp
    from specsample_cupy.runtime import kernel_runtime
    from specsample_cupy.verification import kernel_launch as kernels
    problem = _problem(40, B=16, G=200, V=1024)
    info = kernels.plan_info(*problem[:3], dtype_name="float32", mode=kernels.MODE_LOGITS)
    name = kernels.name_expression("f32", "int", 4, kernels.MODE_LOGITS)
    kern, = kernel_runtime.functions("verify.cu", (name,))
    per_sm = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kern.kernel.ptr, kernels.THREADS,
                                                                      (2 * 200 + 1) * 12)
    assert info["capacity"] == per_sm * cp.cuda.Device().attributes["MultiProcessorCount"]
    res = _call(problem, "exact", False, seed=1)
    _finished("gamma 200")
    tokens, draft, target, lengths = (a.get() for a in problem)
    cpu = verify(tokens, draft, target, seed=1, offset=3, draft_lengths=lengths)
    assert (res.error.get() == 0).all()
    assert (res.accepted.get() == cpu.accepted).mean() >= 0.9   # at most one float near-tie
