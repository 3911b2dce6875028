"""benchmarks/verify_rows_read.py --combine: medians over each label's runs, each method's ratio to exact,
each label's time over the first label's, and runs that lack a method (an older revision's package)."""
import json

import pytest

from helpers_scripts import load_script


@pytest.fixture(scope="module")
def rows_read():
    return load_script("verify_rows_read")


def _run(path, label, times):
    rows = [dict(dtype="float32", B=1, V=151936, drafts="random", method=m, us=us) for m, us in times.items()]
    path.write_text(json.dumps(dict(device="test", label=label, rows=rows)))
    return str(path)


def test_combine_medians_and_ratios(rows_read, tmp_path, capsys):
    runs = [_run(tmp_path / "b1.json", "before", {"exact": 14.0, "sigmoid": 7.0}),
            _run(tmp_path / "b2.json", "before", {"exact": 16.0, "sigmoid": 9.0}),
            _run(tmp_path / "b3.json", "before", {"exact": 15.0, "sigmoid": 100.0}),
            _run(tmp_path / "t1.json", "this", {"exact": 18.0, "sigmoid": 9.0, "sigmoid-paper": 6.0})]
    rows_read.combine(str(tmp_path / "out.json"), runs)
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["labels"] == ["before", "this"] and doc["runs"] == 4
    got = {(r[0], r[5]): dict(zip(doc["columns"], r)) for r in doc["rows"]}
    before_exact, before_sigmoid = got[("before", "exact")], got[("before", "sigmoid")]
    assert (before_exact["us_median"], before_exact["us_min"], before_exact["us_max"]) == (15.0, 14.0, 16.0)
    assert before_sigmoid["us_median"] == 9.0 and before_sigmoid["exact_over_method"] == round(15 / 9, 3)
    assert got[("this", "exact")]["over_first_label"] == round(18 / 15, 3)
    assert got[("this", "sigmoid")]["over_first_label"] == 1.0
    paper = got[("this", "sigmoid-paper")]
    assert paper["exact_over_method"] == 3.0 and paper["over_first_label"] is None   # "before" has none
    assert "sigmoid-paper" in capsys.readouterr().out
