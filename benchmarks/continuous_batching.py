"""Continuous against static batching at one batch size, on a workload of mixed lengths: requests/s
and tokens/s, median of RUNS runs each (alternating, so a change in the machine's load hits both
alike); prints a table and writes JSON.

    python3 benchmarks/continuous_batching.py [--requests 64] [--batch-size 8] [--runs 3] [--cpu-threads N]
                                              [--kv-slack 32]
                                              [--pair embedded|cost-1.5b|cost-7b] [--json F]

Workload: REQUESTS prompts (code openings, numbered), each with max_new_tokens drawn uniformly from
16 to what the context leaves after its prompt, its own seed, sampled at --temperature; EOS ignored,
so every request generates exactly its max_new_tokens and both ways do equal work.
  static      the requests in batches of --batch-size, in input order, each batch decoded until its
              slowest request finishes (one generate_stream() call per batch: rows are never refilled).
  continuous  one generate_stream() call over all requests with --batch-size rows, a finished
              request's row taking the next one at once.
  continuous-host (--device cuda only) the same through the host loop (device_rounds=False), whose
              every round ends in a read: what continuous batching on CUDA was before it ran the
              device loop.
Both give every request the same tokens (its own random numbers): the script checks it. The embedded
model pair, or a cost-realistic one built from it (--pair, models/build_cost_pair.py: the same
tokens, real models' per-run cost; on CUDA), on --device (default cpu). Besides the medians, the ratio of each static run to the
continuous run right after it (their median is steadier on a machine whose load changes), this
process's CPU seconds, the loop's rounds (the work, whatever the machine's load: a round costs about
the same either way) with the share of rows busy in them, and the load average around every run.
"""
import argparse
import json
import os
import platform
import statistics
import time

import numpy as np

from specsample_cupy.decode.continuous import StreamRequest
from specsample_cupy.decode.decoder import SpeculativeDecoder

OPENINGS = ["import os", "def main():", "class Foo:", "for i in range(", "if __name__ ==", "return self.", "x = [",
            "with open(", "def parse(text):\n    ", "# sort the list\n", "try:\n    import", "while True:"]


def workload(dec, n: int, temperature: float, seed: int) -> list[StreamRequest]:
    rng = np.random.default_rng(seed)
    requests = []
    for i in range(n):
        prompt = f"{OPENINGS[rng.integers(len(OPENINGS))]} # {i}\n"
        room = dec.context_length - len(dec.encode_prompts([prompt])[0])
        requests.append(StreamRequest(prompt, int(rng.integers(16, room + 1)), temperature, int(rng.integers(1 << 31))))
    return requests


def decode(dec, requests, batch_size: int, way: str, gamma: int) -> tuple[float, float, dict, dict]:
    """(wall seconds, this process's CPU seconds, {request index: token ids}, counts: the loop's
    rounds and the request-rounds in them) of one run."""
    groups = [requests] if way.startswith("continuous") else [requests[k:k + batch_size]
                                                     for k in range(0, len(requests), batch_size)]
    tokens, counts = {}, {"rounds": 0, "request_rounds": 0, "refills": 0}
    started, cpu_started = time.perf_counter(), time.process_time()
    for k, group in enumerate(groups):
        first = 0 if way.startswith("continuous") else k * batch_size
        stream = dec.generate_stream(group, batch_size, gamma=gamma, ignore_eos=True)
        for out in stream:
            tokens[first + out.index] = out.token_ids
        for key in counts:
            counts[key] += stream.stats[key]
        counts["loop"] = stream.stats["loop"]
    return time.perf_counter() - started, time.process_time() - cpu_started, tokens, counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cpu-threads", type=int, default=None, help="threads per model run (default: every core)")
    ap.add_argument("--kv-slack", type=int, default=32, help="SpeculativeDecoder's kv_slack, for both ways")
    ap.add_argument("--pair", default="embedded")
    ap.add_argument("--pairs-dir", default=None, help="where cost-realistic pairs are built and cached")
    ap.add_argument("--json")
    args = ap.parse_args()
    models = (None, None)
    if args.pair != "embedded":
        from pathlib import Path

        from models.build_cost_pair import build_pair, default_root
        models = build_pair(args.pair, Path(args.pairs_dir) if args.pairs_dir else default_root(),
                            check="cuda" if args.device == "cuda" else "cpu")
    dec = SpeculativeDecoder(*models, device=args.device, cpu_threads=args.cpu_threads, kv_slack=args.kv_slack)
    decoders = {"static": dec, "continuous": dec}
    if args.device == "cuda":
        decoders["continuous-host"] = SpeculativeDecoder(*models, device="cuda", device_rounds=False)
    requests = workload(dec, args.requests, args.temperature, args.seed)
    for way, d in decoders.items():   # warm-up
        decode(d, requests[:args.batch_size], args.batch_size, way, args.gamma)
    walls, cpus = {way: [] for way in decoders}, {way: [] for way in decoders}
    outputs, counts, load = {}, {}, []
    for _ in range(args.runs):
        for way in walls:
            load.append(os.getloadavg()[0])
            wall, cpu, tokens, counts[way] = decode(decoders[way], requests, args.batch_size, way, args.gamma)
            walls[way].append(wall)
            cpus[way].append(cpu)
            outputs.setdefault(way, tokens)
    load.append(os.getloadavg()[0])
    total = sum(len(ids) for ids in outputs["static"].values())
    assert total == sum(r.max_new_tokens for r in requests)
    result = {
        "device": args.device, "pair": args.pair, "cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(),
        "requests": args.requests, "batch_size": args.batch_size, "gamma": args.gamma,
        "temperature": args.temperature, "seed": args.seed, "runs": args.runs, "cpu_threads": args.cpu_threads,
        "kv_slack": args.kv_slack,
        "max_new_tokens": {"min": min(r.max_new_tokens for r in requests),
                           "mean": statistics.mean(r.max_new_tokens for r in requests),
                           "max": max(r.max_new_tokens for r in requests)},
        "total_tokens": total, "wall_s": walls, "cpu_s": cpus, "load_average_1min": load,
        "outputs_equal": all(out == outputs["static"] for out in outputs.values()),
    }
    for way, w in walls.items():
        wall = statistics.median(w)
        result[way] = {"median_wall_s": wall, "requests_per_s": args.requests / wall, "tokens_per_s": total / wall,
                       "median_cpu_s": statistics.median(cpus[way]), **counts[way],
                       "occupancy": counts[way]["request_rounds"] / (counts[way]["rounds"] * args.batch_size)}
    result["speedup_requests_per_s"] = result["continuous"]["requests_per_s"] / result["static"]["requests_per_s"]
    result["speedup_per_run_pair"] = [s / c for s, c in zip(walls["static"], walls["continuous"])]
    result["speedup_median_of_pairs"] = statistics.median(result["speedup_per_run_pair"])
    result["cpu_s_ratio"] = result["static"]["median_cpu_s"] / result["continuous"]["median_cpu_s"]
    result["rounds_ratio"] = result["static"]["rounds"] / result["continuous"]["rounds"]
    if "continuous-host" in walls:
        result["device_loop_speedup_over_host_loop"] = (result["continuous"]["requests_per_s"]
                                                        / result["continuous-host"]["requests_per_s"])
    print(f"{args.requests} requests, max_new_tokens {result['max_new_tokens']['min']}..."
          f"{result['max_new_tokens']['max']} (mean {result['max_new_tokens']['mean']:.0f}), {total} tokens, "
          f"batch size {args.batch_size}, gamma {args.gamma}, T {args.temperature}, {args.pair} pair, {args.device}")
    print("| batching | loop | requests/s | tokens/s | wall s (median) | runs | CPU s (median) | rounds | rows busy |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for way in walls:
        r = result[way]
        print(f"| {way} | {r['loop']} | {r['requests_per_s']:.2f} | {r['tokens_per_s']:.0f} | {r['median_wall_s']:.1f} | "
              f"{', '.join(f'{w:.1f}' for w in walls[way])} | {r['median_cpu_s']:.1f} | {r['rounds']} | "
              f"{r['occupancy']:.0%} |")
    print(f"continuous / static: {result['speedup_requests_per_s']:.2f}x requests/s (medians), "
          f"{result['speedup_median_of_pairs']:.2f}x (median of run pairs); same tokens per request: "
          f"{result['outputs_equal']}; CPU seconds static / continuous {result['cpu_s_ratio']:.2f}, rounds "
          f"{result['rounds_ratio']:.2f}; "
          f"load average {min(load):.1f}..{max(load):.1f}")
    if "device_loop_speedup_over_host_loop" in result:
        print(f"continuous batching, device loop / host loop: {result['device_loop_speedup_over_host_loop']:.2f}x "
              "requests/s (medians)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
