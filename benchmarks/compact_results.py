"""Rewrite result JSON files compactly: floats to 4 significant digits (beyond what the timings resolve),
no spaces, and per-seed runs without the fields their row already states (loop, tokens per request).

    python3 benchmarks/compact_results.py benchmarks/results/*.json
"""
import json
import sys

RUN_FIELDS_IN_ROW = ("loop", "tokens_per_request")


def compact(value):
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, list):
        return [compact(v) for v in value]
    if isinstance(value, dict):
        if "seed" in value:   # one seed's run inside a row
            value = {k: v for k, v in value.items() if k not in RUN_FIELDS_IN_ROW}
        return {k: compact(v) for k, v in value.items()}
    return value


def main(paths):
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        with open(path, "w") as f:
            json.dump(compact(data), f, separators=(",", ":"), ensure_ascii=False)


if __name__ == "__main__":
    main(sys.argv[1:])
