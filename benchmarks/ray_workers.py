"""Throughput of `specsample generate --ray` with 1 and 2 CPU workers on one workload (greedy, so
every run writes the same tokens), median of RUNS runs each; prints a table and writes JSON.

    python3 benchmarks/ray_workers.py [--requests 192] [--max-new-tokens 48] [--batch-size 16] [--json F]
The tokens/s is the command's own: tokens over the wall time after Ray started (loading the models
in the workers included)."""
import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile

WORDS = ["import os", "def main():", "class Foo:", "for i in range(", "if __name__ ==", "return self.", "x = [",
         "with open("]


def workload(path, n):
    rng = random.Random(0)
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"r{i}", "prompt": f"{rng.choice(WORDS)} # {i}"}) + "\n")


def run(inp, workers, args):
    out = tempfile.mktemp(suffix=".jsonl")
    cmd = [sys.executable, "cli.py", "generate", "--input", inp, "--output", out, "--device", "cpu", "--method",
           "greedy", "--max-new-tokens", str(args.max_new_tokens), "--batch-size", str(args.batch_size),
           "--no-progress", "--ray", "--workers", str(workers)]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    with open(out) as f:
        tokens = {json.loads(line)["id"]: json.loads(line)["token_ids"] for line in f}
    os.unlink(out)
    return float(re.search(r"tokens: \d+ \(([\d.]+) tokens/s\)", text).group(1)), tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=192)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    inp = tempfile.mktemp(suffix=".jsonl")
    workload(inp, args.requests)
    rates, outputs = {1: [], 2: []}, {}
    for _ in range(args.runs):
        for workers in (1, 2):   # alternating, so a change in the machine's load hits both alike
            rate, tokens = run(inp, workers, args)
            rates[workers].append(rate)
            outputs.setdefault(workers, tokens)
    same = outputs[1] == outputs[2]
    result = {"cpus": os.cpu_count(), "requests": args.requests, "max_new_tokens": args.max_new_tokens,
              "batch_size": args.batch_size, "runs": args.runs, "tokens_per_s": rates,
              "median": {w: statistics.median(r) for w, r in rates.items()},
              "speedup_2_vs_1": statistics.median(rates[2]) / statistics.median(rates[1]),
              "outputs_equal": same}
    print("| workers | tokens/s (median) | runs |\n|---|---|---|")
    for w in (1, 2):
        print(f"| {w} | {result['median'][w]:.0f} | {', '.join(f'{r:.0f}' for r in rates[w])} |")
    print(f"2 workers / 1 worker: {result['speedup_2_vs_1']:.2f}x; outputs equal: {same}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
