"""Constants shared with the CUDA sources are defined once in Python and generated into codes.cuh;
launch plans are explicit parameters, not environment switches."""
import inspect
import re
from importlib import resources

import pytest

from specsample_cupy.runtime import errors, kernel_runtime, philox
from specsample_cupy.verification import kernel_launch as kernels


def test_generated_header_defines_every_code_and_purpose():
    text = kernel_runtime.codes_header()
    defines = dict(re.findall(r"^#define (SS_\w+) (\d+)u$", text, flags=re.M))
    assert {k: int(v) for k, v in defines.items() if k.startswith("SS_ERR_")} == errors.MACROS
    assert {k[len("SS_PURPOSE_"):]: int(v) for k, v in defines.items() if k.startswith("SS_PURPOSE_")} == \
        philox.PURPOSES
    assert set(errors.MACROS) == {"SS_ERR_TARGET", "SS_ERR_DRAFT", "SS_ERR_TOKEN", "SS_ERR_NO_MASS",
                                  "SS_ERR_LENGTH", "SS_ERR_TEMPERATURE"}
    assert philox.PURPOSES == {"ACCEPT": philox.PURPOSE_ACCEPT, "RESIDUAL": philox.PURPOSE_RESIDUAL,
                               "SAMPLE": philox.PURPOSE_SAMPLE}
    codes = [errors.TARGET_VALUES, errors.DRAFT_VALUES, errors.TOKEN_RANGE, errors.NO_MASS, errors.LENGTH,
             errors.TEMPERATURE]
    assert sorted(errors.MACROS.values()) == sorted(codes) and all(c & (c - 1) == 0 for c in codes)


def _sources():
    root = resources.files("kernels_cu")
    return sorted(p.name for p in root.iterdir() if p.name.endswith(".cu"))


@pytest.mark.parametrize("name", _sources())
def test_every_source_gets_the_generated_header_inlined(name):
    text = kernel_runtime.kernel_source(name)
    assert not re.search(r'^#include "', text, flags=re.M), "a local include was left in"
    if "philox.cuh" in _included(name) or name == "verify.cu":
        assert text.count("#define SS_CODES_CUH") == 1
        assert "#define SS_PURPOSE_ACCEPT 0u" in text


def _included(name, seen=None):
    seen = set() if seen is None else seen
    root = resources.files("kernels_cu")
    for inc in re.findall(r'^#include "([^"]+)"', root.joinpath(name).read_text(), flags=re.M):
        if inc not in seen and inc != kernel_runtime.CODES_HEADER:
            seen.add(inc)
            _included(inc, seen)
    return seen


def test_no_source_contradicts_the_generated_codes():
    """Hand-written #defines of SS_ERR_* / SS_PURPOSE_* are gone from the verification kernel; any
    left elsewhere must at least equal the generated value (an identical redefinition compiles)."""
    root = resources.files("kernels_cu")
    generated = dict(re.findall(r"^#define (SS_\w+) (\S+)$", kernel_runtime.codes_header(), flags=re.M))
    assert not (root / "codes.cuh").is_file(), "codes.cuh is generated, never a file"
    for path in root.iterdir():
        if not path.name.endswith((".cu", ".cuh")):
            continue
        for name, value in re.findall(r"^\s*#define (SS_(?:ERR|PURPOSE)_\w+)\s+(\S+)", path.read_text(), flags=re.M):
            assert path.name not in ("verify.cu", "philox.cuh", "load.cuh", "block_reduce.cuh", "handoff.cuh"), \
                f"{path.name} defines {name} by hand"
            assert generated.get(name) == value, f"{path.name}: {name} {value} != generated {generated.get(name)}"


def test_no_environment_switches_in_the_kernel_loader():
    for module in (kernels, kernel_runtime):
        src = inspect.getsource(module)
        assert "os.environ" not in src and "getenv" not in src
    block_reduce = resources.files("kernels_cu").joinpath("block_reduce.cuh").read_text()
    assert "OrInt" not in block_reduce


def test_plan_options_are_validated_and_hashable():
    opts = kernels.PlanOptions(p1_sweeps=4, p2_sweeps=2, grid=1, lineinfo=True)
    assert hash(opts) == hash(kernels.PlanOptions(p1_sweeps=4, p2_sweeps=2, grid=1, lineinfo=True))
    assert opts != kernels.PlanOptions(p1_sweeps=4, p2_sweeps=2, grid=1)
    for bad in (dict(max_sweeps=0), dict(p1_sweeps=-1), dict(grid=0), dict(lag_waves=-1.0),
                dict(min_sweeps=8, max_sweeps=4), dict(lineinfo="yes"), dict(grid=2.5), dict(walk=1),
                dict(walk="auto")):
        with pytest.raises(ValueError, match="PlanOptions"):
            kernels.PlanOptions(**bad)


def test_plan_argument_is_type_checked():
    import numpy as np
    from specsample_cupy import verify
    t = np.zeros((1, 1), np.int32)
    with pytest.raises(TypeError, match="plan"):
        verify(t, np.zeros((1, 1, 4), np.float32), np.zeros((1, 2, 4), np.float32), plan={"grid": 1})


def test_p1_items_lengthen_at_small_batches_only_where_half_the_grid_stays_free():
    from specsample_cupy.verification.kernel_launch import MODE_LOGITS, MODE_MIN_P, MODE_PROBS, PlanOptions, _p1_sweeps
    R, cap, sms, fp32, fp16 = 11, 528, 132, 1024, 2048     # gamma 5; an H200's grid; elements per sweep
    default, sized_only = PlanOptions(), PlanOptions(min_sweeps=1)

    def p1(V, B, sweep, opts=default, mode=MODE_LOGITS, R=R):
        return _p1_sweeps(V, B, R, sweep, cap, sms, mode, opts)
    # B = 1: the occupancy alone cuts V = 151936 into 38 items of 4 sweeps; 8192 elements make 19.
    assert p1(151936, 1, fp32, sized_only) == 4
    assert p1(151936, 1, fp32) == 8
    assert p1(151936, 1, fp16) == 4
    assert p1(32000, 4, fp32) == 8        # B = 4: 176 items
    # Where 8192-element items would fill more than half the grid the occupancy decides...
    assert p1(151936, 2, fp32) == p1(151936, 2, fp32, sized_only) == 7
    assert p1(32000, 8, fp32) == 6
    # ...except for one request's logits: about one item per multiprocessor (12 slices of 11 rows).
    assert p1(256000, 1, fp32, sized_only) == 6
    assert p1(256000, 1, fp32) == 21 and -(-250 // 21) == 12
    assert p1(256000, 1, fp16) == 11 and -(-125 // 11) == 12
    assert p1(151936, 1, fp32, R=17) == 22 and -(-149 // 22) == 7     # gamma 8: 7 slices of 17 rows
    for mode in (MODE_PROBS, MODE_MIN_P):
        assert p1(256000, 1, fp32, mode=mode) == 6
    # Large batches: longer items than the floor anyway.
    assert p1(151936, 64, fp32) == p1(151936, 64, fp32, sized_only)
    assert p1(151936, 1, fp32, PlanOptions(max_sweeps=2)) == 2
    assert p1(256000, 1, fp32, PlanOptions(max_sweeps=16)) == 16
