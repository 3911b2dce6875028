"""benchmarks/decode_summary.py reads every form a committed decode result takes: rows whose ideal and
efficiency keep their ranges or only their medians, and files that hold several pairs or layouts."""
import pytest

from helpers_scripts import BENCHMARKS, load_script


@pytest.fixture(scope="module")
def summary():
    return load_script("decode_summary")


def _row(method, gamma, speedup, efficiency, compact):
    stat = (lambda v: v) if compact else (lambda v: {"median": v, "min": v * 0.9, "max": v * 1.1})
    return {"method": method, "gamma": gamma, "speedup": {"median": speedup, "min": speedup, "max": speedup},
            "ideal": stat(speedup / efficiency), "efficiency": stat(efficiency), "mean_gamma": 4.0,
            "ms_per_token": {"median": 2.0, "min": 2.0, "max": 2.0}}


def _report(pair, compact):
    rows = [_row("target", 0, 1.0, 1.0, compact), _row("greedy", 4, 2.5, 0.99, compact),
            _row("greedy", 6, 2.8, 0.98, compact), _row("greedy", "auto", 3.0, 0.97, compact)]
    return {"pair": pair, "runs": [{"batch": 1, "rows": rows}]}


@pytest.mark.parametrize("compact", [False, True], ids=["ranges", "medians"])
def test_summary_of_either_row_form(summary, compact):
    (pair, batch, method, ms, auto, best, low), = summary.summary_rows(_report("p", compact))
    assert (pair, batch, method, ms, best["gamma"]) == ("p", 1, "greedy", 2.0, 6)
    assert summary.median(auto["efficiency"]) == 0.97 and low == 0.97


def test_files_holding_several_pairs_or_layouts(summary):
    data = {"pairs": {"a": _report("a", True), "b": _report("b", False)}}
    assert [r["pair"] for r in summary.reports(data)] == ["a", "b"]
    data = {"layouts": {"onnx": _report("p", True), "gqa": _report("p", True)}, "per_seed_runs": []}
    assert [r["pair"] for r in summary.reports(data)] == ["p (onnx)", "p (gqa)"]
    assert list(summary.reports(_report("c", True)))[0]["pair"] == "c"


def test_the_committed_decode_results_all_summarise(summary, capsys):
    results = sorted((BENCHMARKS / "results").glob("decode_*.json"))
    assert results
    summary.main([str(p) for p in results])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) > 2 + len(results)   # header, rule, and rows
