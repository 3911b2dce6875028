"""The walk order of the verification kernel (kernels_cu/verify.cu's header): at large batches exact,
probability and greedy verification decide position after position and never read the rows past a
request's first rejection. It must change which rows are read, never a result: field by field equal
to the all-rows order and to the CPU reference, on any grid (one block, a few, more than fit), call
after call (its counters return to zero), with ragged lengths, greedy and sampling requests mixed,
fully accepted requests, one-hot drafts, and bad data where a decision reads it (error codes) or
where none does (no effect). Each wait is bounded: a hang fails the test instead of stalling it."""
import numpy as np
import pytest

from helpers_verify import random_problem, softmax, wait_or_fail
from specsample_cupy import verify

pytestmark = pytest.mark.gpu

B, G = 48, 5


def _problem(seed, V, probs=False):
    """A batch where some requests accept every draft (draft rows equal to the target's), some
    reject early, lengths are ragged, and (logits) a few requests are greedy (temperature 0)."""
    rng = np.random.default_rng(seed)
    tokens, draft, target = random_problem(rng, B, G, V, scale=2.0, closeness=0.7)
    draft[: B // 4] = target[: B // 4, :G]              # p = q: every draft of these is accepted,
    tokens[: B // 4] = target[: B // 4, :G].argmax(-1)  # greedy ones too
    temperature = np.where(np.arange(B) % 7 == 3, 0.0, 1.0).astype(np.float32)
    lengths = rng.integers(0, G + 1, B).astype(np.int32)
    lengths[: B // 8] = G
    if probs:   # probabilities are verified at temperature 1
        draft, target = softmax(draft.astype(np.float64)), softmax(target.astype(np.float64))
        temperature = 1.0
    return tokens.astype(np.int32), draft.astype(np.float32), target.astype(np.float32), lengths, temperature


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _fields(res):
    return {f: _host(getattr(res, f)) for f in ("tokens", "accepted", "emitted", "error")}


def _run(problem, xp, plan=None, method="exact", probs=False, onehot=False):
    tokens, draft, target, lengths, temperature = (xp.asarray(a) if np.ndim(a) else a for a in problem)
    out = _fields(verify(tokens, None if onehot else draft, target, method=method, probs=probs, seed=5,
                         offset=11, draft_lengths=lengths, temperature=temperature, plan=plan))
    if xp is not np:
        ev = xp.cuda.Event()
        ev.record()
        wait_or_fail([ev], 60, f"walk plan {plan}")
    return out


def _assert_same(a, b, what):
    for f in a:
        np.testing.assert_array_equal(a[f], b[f], err_msg=f"{what}: {f}")


CASES = [("exact", False, False), ("exact", True, False), ("exact", False, True), ("greedy", False, False)]


@pytest.mark.parametrize("V", [4096, 3001])          # 16-byte loads; scalar loads
@pytest.mark.parametrize("method, probs, onehot", CASES)
def test_walk_equals_all_rows_and_the_reference_on_any_grid(method, probs, onehot, V):
    import cupy as cp
    from specsample_cupy.verification.kernel_launch import PlanOptions
    problem = _problem(7, V, probs)
    cpu = _run(problem, np, method=method, probs=probs, onehot=onehot)
    all_rows = _run(problem, cp, PlanOptions(walk=False), method, probs, onehot)
    _assert_same(all_rows, cpu, "all rows vs CPU")
    accepted, lengths = cpu["accepted"], problem[3]
    assert (accepted >= 0).all() and (accepted < lengths).any() and ((accepted == G) & (lengths == G)).any(), \
        "the batch must mix full acceptance and early rejection"
    for grid in (None, 1, 7, 4096):
        for repeat in range(2):    # the walk's counters must be back at zero after every call
            walked = _run(problem, cp, PlanOptions(walk=True, grid=grid), method, probs, onehot)
            _assert_same(walked, all_rows, f"walk grid={grid} call {repeat}")


@pytest.mark.parametrize("method", ["exact", "greedy"])
def test_walk_never_reads_rows_past_the_stop_and_flags_rows_it_reads(method):
    """Rows past each request's stop become NaN: nothing changes. A NaN in a row at the stop (read by
    the decision or the residual) gives the request its error code and no token, as on the CPU."""
    import cupy as cp
    from specsample_cupy.verification.kernel_launch import PlanOptions
    walk = PlanOptions(walk=True)
    problem = _problem(9, 4096)
    tokens, draft, target, lengths, temperature = problem
    clean = _run(problem, cp, walk, method)
    n = clean["accepted"]
    spoiled_d, spoiled_t = draft.copy(), target.copy()
    for b in range(B):
        spoiled_t[b, n[b] + 1:] = np.nan
        spoiled_d[b, n[b] + 1:] = np.nan
        if method == "greedy" or temperature[b] == 0:
            spoiled_d[b] = np.nan          # greedy decisions read no draft row
    spoiled = (tokens, spoiled_d, spoiled_t, lengths, temperature)
    _assert_same(_run(spoiled, cp, walk, method), clean, "NaN past the stop")
    _assert_same(_run(spoiled, np, None, method), clean, "CPU, NaN past the stop")
    read = spoiled_t.copy()
    b = int(np.argmax(n < lengths))     # a request that stops before its last draft
    read[b, n[b], 17] = np.nan
    bad = (tokens, spoiled_d, read, lengths, temperature)
    gpu, cpu = _run(bad, cp, walk, method), _run(bad, np, None, method)
    _assert_same(gpu, cpu, "NaN at the stop")
    assert gpu["error"][b] != 0 and (gpu["tokens"][b] == -1).all()
    others = np.arange(B) != b
    np.testing.assert_array_equal(gpu["tokens"][others], clean["tokens"][others])


def test_the_plan_walks_when_asked_and_the_method_reads_whole_rows():
    import cupy as cp
    from specsample_cupy.verification import kernel_launch as kernels

    def walks(B, V, mode=kernels.MODE_LOGITS, **plan):
        tokens = cp.zeros((B, 5), cp.int32)
        draft, target = cp.zeros((B, 5, V), cp.float32), cp.zeros((B, 6, V), cp.float32)
        opts = kernels.PlanOptions(**plan) if plan else None
        return kernels.plan_info(tokens, draft, target, dtype_name="float32", mode=mode, options=opts)["walk"]

    assert not walks(64, 151936, walk=False)          # walk=False reads every row at once
    assert not walks(8, 151936)                       # and so does the default plan for a small call
    assert walks(64, 151936, walk=True) and walks(1, 32000, kernels.MODE_PROBS, walk=True)
    assert not walks(64, 151936, kernels.MODE_SIGMOID, walk=True)
    assert not walks(64, 151936, kernels.MODE_MIN_P, walk=True)


@pytest.mark.parametrize("B, V, dtype, walks", [(64, 151936, "float32", True), (64, 151936, "float16", False),
                                                (128, 151936, "float16", True), (8, 151936, "float32", False),
                                                (64, 32000, "float32", False)])
def test_the_default_plan_walks_where_the_rows_hold_enough_bytes(B, V, dtype, walks):
    """PlanOptions.walk None: the walk where the 2 gamma + 1 rows of every request hold WALK_MIN_BYTES."""
    import cupy as cp
    from specsample_cupy.verification.kernel_launch import MODE_LOGITS, WALK_MIN_BYTES, plan_info
    tokens = cp.zeros((B, G), cp.int32)
    draft, target = cp.zeros((B, G, V), dtype), cp.zeros((B, G + 1, V), dtype)
    assert (B * (2 * G + 1) * V * draft.itemsize >= WALK_MIN_BYTES) == walks
    assert plan_info(tokens, draft, target, dtype_name=dtype, mode=MODE_LOGITS)["walk"] is walks
