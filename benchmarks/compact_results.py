"""Rewrite result JSON files compactly (specsample_cupy/bench/result_json.py).

    python3 benchmarks/compact_results.py benchmarks/results/*.json
"""
import json
import sys

from specsample_cupy.bench.result_json import write

if __name__ == "__main__":
    for path in sys.argv[1:]:
        with open(path) as f:
            write(path, json.load(f))
