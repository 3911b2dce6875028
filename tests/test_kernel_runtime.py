"""kernel_runtime: the LRU plan cache that keeps plans a CUDA graph captured, and launches that
threads can share (each launch carries the values its own call wrote)."""
import ctypes
import sys
import threading
import time

import numpy as np
import pytest

from specsample_cupy.runtime import kernel_runtime


class FakeStream:
    def __init__(self, capturing=False, ptr=0):
        self.capturing, self.ptr = capturing, ptr

    def is_capturing(self):
        return self.capturing


class BrokenStream:
    """A stream whose capture query fails (as the legacy default stream's does while another captures)."""
    ptr = 0

    def is_capturing(self):
        raise AttributeError("no capture query")


def _cache_with(limit, keys, stream=FakeStream()):
    cache = kernel_runtime.PlanCache(limit)
    for key in keys:
        cache.get(key, lambda key=key: f"plan {key}", stream)
    return cache


def test_plan_cache_returns_the_same_plan_for_the_same_key():
    cache = kernel_runtime.PlanCache(4)
    first = cache.get("a", object, FakeStream())
    assert cache.get("a", object, FakeStream()) is first
    assert cache.get("b", object, FakeStream()) is not first
    made = []
    cache.get("a", lambda: made.append(1), FakeStream())
    assert not made, "a cached plan is never made again"


def test_plan_cache_evicts_the_least_recently_used_past_its_limit():
    cache = _cache_with(3, ["a", "b", "c"])
    cache.get("a", object, FakeStream())          # "b" is now the least recently used
    cache.get("d", object, FakeStream())
    assert "b" not in cache and all(k in cache for k in "acd")
    assert len(cache) == 3


def test_plan_cache_keeps_plans_used_while_capturing():
    cache = kernel_runtime.PlanCache(2)
    captured = cache.get("graph", object, FakeStream(capturing=True))
    for i in range(10):
        cache.get(i, object, FakeStream())
    assert cache.pinned("graph") and cache.get("graph", object, FakeStream()) is captured
    assert len(cache) == 3   # the pinned plan and the 2 most recent
    assert 8 in cache and 9 in cache


def test_plan_cache_pins_a_cached_plan_once_captured():
    cache = _cache_with(2, ["a", "b"])
    plan = cache.get("a", object, FakeStream(capturing=True))
    assert plan == "plan a" and cache.pinned("a")
    for i in range(5):
        cache.get(i, object, FakeStream())
    assert cache.get("a", object, FakeStream()) == "plan a"


def test_a_failed_capture_query_counts_as_not_capturing():
    cache = kernel_runtime.PlanCache(1)
    cache.get("a", object, BrokenStream())
    assert not cache.pinned("a")
    cache.get("b", object, BrokenStream())
    assert "a" not in cache


def test_plan_cache_limit_must_be_positive():
    with pytest.raises(ValueError, match="limit"):
        kernel_runtime.PlanCache(0)


class RecordingDriver:
    """Stands in for cuLaunchKernel: reads every argument through the parameter block, as the driver
    does, and sleeps so that an unlocked writer would overwrite the slots meanwhile."""

    def __init__(self, types):
        self.types, self.launched = types, []

    def __call__(self, func, gx, gy, gz, bx, by, bz, shared, stream_ptr, params, extra):
        addresses = (ctypes.c_void_p * len(self.types)).from_address(params)
        first = [t.from_address(a).value for t, a in zip(self.types, addresses)]
        time.sleep(0.0005)
        again = [t.from_address(a).value for t, a in zip(self.types, addresses)]
        self.launched.append((first, again, (gx, bx, shared, stream_ptr)))


def test_launch_writes_leading_and_named_slots_then_launches():
    types = [ctypes.c_int64, ctypes.c_float, ctypes.c_uint32, ctypes.c_void_p]
    driver = RecordingDriver(types)
    launch = kernel_runtime.Launch(1234, [ctypes.c_int64(), ctypes.c_float(), ("fixed", ctypes.c_uint32(9)),
                                          ("out", ctypes.c_void_p())], _driver=driver)
    launch(FakeStream(ptr=77), 5, 128, 64, leading=(3, 0.5), out=4096)
    launch.set(fixed=11)
    launch(FakeStream(ptr=77), 6, 256)
    (first, again, shape), (second, _, shape2) = driver.launched
    assert first == again == [3, 0.5, 9, 4096] and shape == (5, 128, 64, 77)
    assert second == [3, 0.5, 11, 4096] and shape2 == (6, 256, 0, 77)


def test_launch_takes_a_structure_slot_by_value():
    class Pair(ctypes.Structure):
        _fields_ = [("a", ctypes.c_int32), ("b", ctypes.c_int64)]
    seen = []

    def driver(func, gx, gy, gz, bx, by, bz, shared, stream_ptr, params, extra):
        addresses = (ctypes.c_void_p * 2).from_address(params)
        pair = Pair.from_address(addresses[1])
        seen.append((ctypes.c_int32.from_address(addresses[0]).value, pair.a, pair.b))

    pair = Pair(1, 2)
    launch = kernel_runtime.Launch(1, [("n", ctypes.c_int32()), ("pair", pair)], _driver=driver)
    pair.b = 40
    launch(FakeStream(), 1, 32, n=7)
    assert seen == [(7, 1, 40)]


def test_threads_sharing_a_launch_each_launch_their_own_values():
    types = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    driver = RecordingDriver(types)
    launch = kernel_runtime.Launch(1, [ctypes.c_int64(), ctypes.c_int64(), ("out", ctypes.c_void_p())],
                                   _driver=driver)
    calls = 60

    def worker(t):
        for i in range(calls):
            value = t * 1000 + i
            launch(FakeStream(ptr=t), 1, 32, leading=(value, -value), out=value + 1)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(driver.launched) == 4 * calls
    for first, again, (_, _, _, stream_ptr) in driver.launched:
        value = first[0]
        assert first == again == [value, -value, value + 1], "another thread's values were launched"
        assert value // 1000 == stream_ptr, "a launch carried another thread's values"
    launched = sorted(first[0] for first, _, _ in driver.launched)
    assert launched == sorted(t * 1000 + i for t in range(1, 5) for i in range(calls))


# ---- on a GPU ----

def _run_in_threads(jobs):
    """Run the jobs in threads of their own, their loops started together, with threads switching far
    more often than by default (so a launch whose arguments another thread can overwrite shows);
    their results in job order."""
    results, errors = [None] * len(jobs), []
    barrier = threading.Barrier(len(jobs))

    def run(k):
        try:
            results[k] = jobs[k](barrier.wait)
        except Exception as exc:   # re-raised below, in the test's thread
            barrier.abort()
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(jobs))]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    if errors:
        raise errors[0]
    return results


def _on_own_stream(calls, make_inputs, call, seed):
    """A job: `calls` calls of call(inputs, seed, i) on a stream of its own, after start(); their host
    results."""
    def job(start):
        import cupy as cp
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            inputs = make_inputs(seed)
            stream.synchronize()
            start()
            outs = [call(inputs, seed, i) for i in range(calls)]
            stream.synchronize()
            return [o.get() for o in outs]
    return job


def _logits(seed):
    import cupy as cp
    return cp.asarray(np.random.default_rng(seed).standard_normal((16, 1000)).astype(np.float32))


def _sample(logits, seed, i):
    from specsample_cupy import sample_tokens
    return sample_tokens(logits, temperature=1.0, seed=seed, offset=i)


def _problem(seed, B=8, G=3, V=1000):
    import cupy as cp
    from helpers_verify import random_problem
    return tuple(cp.asarray(a) for a in random_problem(np.random.default_rng(seed), B, G, V))


def _verify_tokens(problem, seed, i):
    from specsample_cupy import verify
    return verify(*problem, method="exact", seed=seed, offset=i).packed


@pytest.mark.gpu
@pytest.mark.parametrize("make_inputs, call", [(_logits, _sample), (_problem, _verify_tokens)],
                         ids=["sample_tokens", "verify"])
def test_threads_get_what_sequential_calls_get(make_inputs, call):
    import cupy as cp
    jobs = [_on_own_stream(300, make_inputs, call, seed) for seed in (11, 12)]
    sequential = [job(lambda: None) for job in jobs]
    # Fresh memory for the concurrent calls' outputs: a launch that never wrote its output must not
    # find the sequential calls' results there.
    cp.get_default_memory_pool().free_all_blocks()
    concurrent = _run_in_threads(jobs)
    for seq, con in zip(sequential, concurrent):
        for i, (a, b) in enumerate(zip(seq, con)):
            np.testing.assert_array_equal(a, b, err_msg=f"call {i}")


@pytest.mark.gpu
def test_captured_graph_survives_plan_eviction():
    """A graph captured from verify() keeps using its plan's workspace after more than the cache's
    limit of other plans were made (and their memory freed and reused)."""
    import cupy as cp
    from specsample_cupy import verify
    from specsample_cupy.verification import kernel_launch as kernels
    problem = _problem(5, B=16, G=5, V=4096)
    seed, offset = cp.asarray([123], cp.int64), cp.asarray([0], cp.int64)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        verify(*problem, seed=seed, offset=offset)      # the plan and its workspace, outside the capture
        stream.begin_capture()
        res = verify(*problem, seed=seed, offset=offset)
        graph = stream.end_capture()
        for B in range(1, kernels.PLAN_LIMIT + 10):   # evicts every unpinned plan
            verify(*_problem(B, B=B, G=1, V=64), seed=1)
        stream.synchronize()
        cp.get_default_memory_pool().free_all_blocks()
        garbage = [cp.full(n, 12345, cp.int32) for n in (1 << 10, 1 << 14, 1 << 18)]
        for step in range(3):
            offset[...] = step
            graph.launch(stream)
            direct = verify(*problem, seed=123, offset=step)
            stream.synchronize()
            np.testing.assert_array_equal(res.packed.get(), direct.packed.get(), err_msg=f"step {step}")
    del garbage


def test_kernel_source_inlines_the_files_a_reader_gives():
    """Another revision's sources (benchmarks/warp_rows_ab.py reads them from git): includes come from
    the same reader, each file once, and codes.cuh is generated whatever the reader holds."""
    files = {"main.cu": '#include "a.cuh"\n#include "codes.cuh"\nmain();\n',
             "a.cuh": '#pragma once\n#include "b.cuh"\na();\n', "b.cuh": '#include "a.cuh"\nb();\n'}
    read = []
    text = kernel_runtime.kernel_source("main.cu", read=lambda name: read.append(name) or files[name])
    assert sorted(read) == ["a.cuh", "b.cuh", "main.cu"]
    assert text.index("b();") < text.index("a();") < text.index("main();")
    assert text.count("a();") == 1 and "#pragma once" not in text and '#include' not in text
    assert kernel_runtime.codes_header() in text
