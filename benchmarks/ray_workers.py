"""Throughput of `specsample generate --ray` with 1 and 2 CPU workers (greedy, so every run writes the
same tokens), per workload size, median of RUNS runs each, alternating; prints a table and writes JSON.

    python3 benchmarks/ray_workers.py [--requests 192,1536] [--max-new-tokens 48] [--batch-size 16] [--runs 3]
                                      [--static] [--wait-idle PCT] [--json F]

The tokens/s is the command's own: tokens over the wall time after Ray started (the workers' start
and loading the models included). That start costs a few seconds whatever the work (on two cores,
Ray Data's helper actors and the workers start side by side), so the small workload shows it and
the large one the throughput of decoding. Besides the medians: the ratio of each 2-worker run to the
1-worker run right before it (their median is steadier on a machine whose load changes), each run's
whole wall time (starting Ray included) and the load average before it. --static: the workers
batch statically (`generate --static`). --wait-idle PCT: on a machine shared with other work, start
each pair of runs only once the CPUs were at least PCT % idle over 5 s (Ray's CPU workers run at a
low priority, so a busy core leaves two workers little more than one)."""
import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

WORDS = ["import os", "def main():", "class Foo:", "for i in range(", "if __name__ ==", "return self.", "x = [",
         "with open("]


def workload(path, n):
    rng = random.Random(0)
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"r{i}", "prompt": f"{rng.choice(WORDS)} # {i}"}) + "\n")


def idle_fraction(seconds: float = 5.0) -> float:
    """The share of the machine's CPU time that was idle over the next `seconds` (/proc/stat)."""
    def times():
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields)   # idle + iowait, all
    idle0, all0 = times()
    time.sleep(seconds)
    idle1, all1 = times()
    return (idle1 - idle0) / max(all1 - all0, 1)


def wait_idle(percent: float, limit_s: float = 1200) -> float:
    """Wait (at most limit_s) until the CPUs were `percent` % idle over 5 s; that idle share."""
    waited = time.perf_counter()
    while (idle := idle_fraction()) * 100 < percent and time.perf_counter() - waited < limit_s:
        pass
    return idle


def run(inp, workers, args):
    out = tempfile.mktemp(suffix=".jsonl")
    cmd = [sys.executable, "cli.py", "generate", "--input", inp, "--output", out, "--device", "cpu", "--method",
           "greedy", "--max-new-tokens", str(args.max_new_tokens), "--batch-size", str(args.batch_size),
           "--no-progress", "--ray", "--workers", str(workers)] + (["--static"] if args.static else [])
    load = os.getloadavg()[0]
    started = time.perf_counter()
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    wall = time.perf_counter() - started
    with open(out) as f:
        tokens = {json.loads(line)["id"]: json.loads(line)["token_ids"] for line in f}
    os.unlink(out)
    rate = float(re.search(r"tokens: \d+ \(([\d.]+) tokens/s\)", text).group(1))
    return {"tokens_per_s": rate, "wall_s": round(wall, 2), "load_before": load}, tokens


def measure(requests: int, args) -> dict:
    """1 and 2 workers on a workload of `requests` prompts, args.runs times each, alternating."""
    inp = tempfile.mktemp(suffix=".jsonl")
    workload(inp, requests)
    runs, outputs, idle = {1: [], 2: []}, {}, []
    for _ in range(args.runs):
        if args.wait_idle:
            idle.append(round(wait_idle(args.wait_idle), 3))
        for workers in (1, 2):   # alternating, so a change in the machine's load hits both alike
            measured, tokens = run(inp, workers, args)
            runs[workers].append(measured)
            outputs.setdefault(workers, tokens)
    os.unlink(inp)
    rates = {w: [r["tokens_per_s"] for r in runs[w]] for w in runs}
    pairs = [two / one for one, two in zip(rates[1], rates[2])]
    return {"requests": requests, "tokens": sum(map(len, outputs[1].values())), "tokens_per_s": rates,
            "wall_s": {w: [r["wall_s"] for r in runs[w]] for w in runs},
            "load_before": {w: [r["load_before"] for r in runs[w]] for w in runs},
            "idle_before_pair": idle,
            "median": {w: statistics.median(r) for w, r in rates.items()},
            "speedup_2_vs_1": statistics.median(rates[2]) / statistics.median(rates[1]),
            "speedup_per_pair": pairs, "speedup_per_pair_median": statistics.median(pairs),
            "outputs_equal": outputs[1] == outputs[2]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", default="192,1536", help="workload sizes, comma-separated")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--static", action="store_true")
    ap.add_argument("--wait-idle", type=float, default=0, metavar="PCT")
    ap.add_argument("--json")
    args = ap.parse_args()
    workloads = [measure(int(n), args) for n in args.requests.split(",")]
    print("| requests | workers | tokens/s (median) | runs | wall s (starting Ray included) |\n|---|---|---|---|---|")
    for m in workloads:
        for w in (1, 2):
            print(f"| {m['requests']} | {w} | {m['median'][w]:.0f} | "
                  f"{', '.join(f'{r:.0f}' for r in m['tokens_per_s'][w])} | "
                  f"{', '.join(f'{r:.1f}' for r in m['wall_s'][w])} |")
    for m in workloads:
        print(f"{m['requests']} requests: 2 workers / 1 worker {m['speedup_2_vs_1']:.2f}x (pairs: "
              f"{', '.join(f'{p:.2f}' for p in m['speedup_per_pair'])}); outputs equal: {m['outputs_equal']}")
    if args.json:
        result = {"cpus": os.cpu_count(), "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
                  "batching": "static" if args.static else "continuous", "runs": args.runs, "workloads": workloads}
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
