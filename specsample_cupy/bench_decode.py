"""`specsample bench decode`: target-only vs speculative decoding with each verification method."""
from __future__ import annotations

import itertools
import json

import click

from specsample_cupy.cli_decode import load_decoder, resolve_device

BENCH_METHODS = ("target", "exact", "sigmoid", "baseline", "greedy")
# The embedded pair was trained on Python standard-library code.
DEFAULT_PROMPTS = (
    "def __init__(self, ",
    "import os\nimport sys\n\n\ndef main(",
    "class Parser:\n    \"\"\"",
    "    for i in range(",
    "    if not isinstance(",
    "    return self.",
    "    with open(path) as f:\n        ",
    "    except ValueError:\n        ",
)
COLUMNS = (
    ("method", "{}"), ("tokens_per_s", "{:.1f}"), ("speedup", "{:.2f}x"), ("acceptance_rate", "{:.3f}"),
    ("mean_accepted_per_round", "{:.2f}"), ("verify_time_per_round_s", "{:.2e}"),
    ("host_overhead_per_round_s", "{:.2e}"), ("host_overhead_per_round_untimed_s", "{:.2e}"),
    ("loop_overhead_per_round_s", "{:.2e}"),
    ("model_time_s", "{:.3f}"), ("rounds", "{}"),
)


def results_table(rows: list[dict]) -> str:
    cells = [[name for name, _ in COLUMNS]] + [
        ["-" if r[name] is None else fmt.format(r[name]) for name, fmt in COLUMNS] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells)


def _median_call(outputs):
    calls = sorted(outputs, key=lambda o: o.stats["tokens_per_s"])
    return calls[len(calls) // 2], [o.stats["tokens_per_s"] for o in calls]


def replayed_round_model_time(decoder, gamma: int, replays: int = 50) -> float | None:
    """GPU seconds of one device round's model runs alone (the draft's S = 2 and gamma - 1 S = 1 runs,
    the target's S = gamma + 1 run), from `replays` back-to-back replays of those captured graphs
    between two CUDA events, right after a generate() with device rounds left their feeds in place
    (a replay rewrites only its present scratch and logits, never the cache). None off that path."""
    import cupy
    draft, target = decoder.draft, decoder.target
    plans = getattr(draft, "_plan", None), getattr(target, "_plan", None)
    draft_steps = {2, 1} if gamma > 1 else {2}
    if None in plans or not draft_steps <= set(plans[0].steps) or gamma + 1 not in plans[1].steps:
        return None
    runs = [(draft, plans[0].steps[2])] + [(draft, plans[0].steps[1])] * (gamma - 1) + \
        [(target, plans[1].steps[gamma + 1])]
    stream = decoder.stream
    with stream:
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        for session, step in runs:   # warm
            session.replay(step)
        start.record(stream)
        for _ in range(replays):
            for session, step in runs:
                session.replay(step)
        end.record(stream)
        end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / 1e3 / replays


def run_bench(decoder, prompts, *, max_new_tokens, gamma, temperature, seed, repeats=3) -> list[dict]:
    """`repeats` generate() calls per method over the same prompts, after a warm-up call; each row is
    the call with the median tokens/s (host-bound timings vary between calls), with every call's
    tokens/s listed. Speedups are relative to target-only decoding.

    On CUDA the model runs and verify() are timed with CUDA events, which take GPU time of their own. So each
    method also runs `repeats` calls without those events (tokens_per_s_untimed), and with device
    rounds host_overhead_per_round_untimed_s is such a call's wall minus its prefill's model time (those
    few runs stay timed) and, per round, the round's model runs replayed back to back
    (replayed_round_model_time) and the timed calls' verify time (the same rounds: same prompts and
    seed)."""
    def run(method, n_tokens):
        return decoder.generate(prompts, max_new_tokens=n_tokens, gamma=0 if method == "target" else gamma,
                                method=method, temperature=0.0 if method == "greedy" else temperature, seed=seed)

    # Warm-up with the measured shapes: allocators, kernel compilation (cache compaction's too), ONNX
    # Runtime's first runs and, on CUDA, the capture of each run shape's graph happen here.
    for method in BENCH_METHODS:
        run(method, max_new_tokens)
    rows = []
    for method in BENCH_METHODS:
        timed, each = _median_call([run(method, max_new_tokens) for _ in range(repeats)])
        stats = timed.stats
        row = {"method": method, "tokens_per_s_each": each, **{k: stats[k] for k in (
            "tokens_per_s", "acceptance_rate", "mean_accepted_per_round", "verify_time_per_round_s",
            "host_overhead_per_round_s", "loop_overhead_per_round_s", "model_run_host_s", "model_time_s",
            "sampling_time_s", "read_wait_per_round_s", "wall_s", "rounds", "prefill_model_time_s",
            "generated_tokens", "device_rounds", "discarded_rounds")}}
        row["tokens_per_s_untimed"] = row["host_overhead_per_round_untimed_s"] = None
        if stats["device"] == "cuda":
            decoder.time_model_runs = False
            try:
                untimed, _ = _median_call([run(method, max_new_tokens) for _ in range(repeats)])
            finally:
                decoder.time_model_runs = True
            u = untimed.stats
            row["tokens_per_s_untimed"], row["wall_s_untimed"] = u["tokens_per_s"], u["wall_s"]
            row["prefill_model_time_s_untimed"] = u["prefill_model_time_s"]
            row["round_model_time_replayed_s"] = None
            # baseline's verify() is CuPy ops launched one by one from the host: its time is not the same
            # in another call, so it gets no un-instrumented figure.
            if u["device_rounds"] is True and method != "baseline":
                replayed = row["round_model_time_replayed_s"] = replayed_round_model_time(decoder, gamma)
                if replayed is not None:
                    # The same prompts and seed give the same rounds, so the timed calls' verify time.
                    row["host_overhead_per_round_untimed_s"] = max(
                        (u["wall_s"] - u["prefill_model_time_s"]) / u["rounds"] - replayed
                        - stats["verify_time_per_round_s"], 0.0)
        rows.append(row)
    baseline = rows[0]["tokens_per_s"]
    for row in rows:
        row["speedup"] = row["tokens_per_s"] / baseline if baseline else 0.0
    return rows


@click.command("decode")
@click.option("--target", type=click.Path(exists=True, file_okay=False), default=None,
              help="Target model directory (default: the embedded stdlib-code target).")
@click.option("--draft", type=click.Path(exists=True, file_okay=False), default=None,
              help="Draft model directory (default: the embedded stdlib-code draft).")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default=None,
              help="Default: cuda when usable, else cpu.")
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--gamma", default=5, show_default=True, type=click.IntRange(min=1))
@click.option("--prompts", "n_prompts", default=4, show_default=True, type=click.IntRange(min=1),
              help="Batch size: this many prompts, cycled from a built-in list.")
@click.option("--temperature", default=1.0, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(min=1),
              help="Measured calls per method; the median one is reported.")
@click.option("--cuda-graphs/--no-cuda-graphs", default=True, show_default=True,
              help="On CUDA: fixed bindings and CUDA-graph replay of model runs where the models allow it.")
@click.option("--device-rounds/--host-rounds", default=True, show_default=True,
              help="With CUDA graphs: speculative rounds' bookkeeping on the GPU, or every feed built on the host.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Also write the results to this JSON file.")
def bench_decode(target, draft, device, max_new_tokens, gamma, n_prompts, temperature, seed, repeats, cuda_graphs,
                 device_rounds, json_path):
    """Tokens/s, acceptance, verify time and host overhead: target-only vs each verification method."""
    device = resolve_device(device)
    decoder = load_decoder(target, draft, device, cuda_graphs, device_rounds)
    prompts = list(itertools.islice(itertools.cycle(DEFAULT_PROMPTS), n_prompts))
    rows = run_bench(decoder, prompts, max_new_tokens=max_new_tokens, gamma=gamma, temperature=temperature,
                     seed=seed, repeats=repeats)
    click.echo(f"device={device} batch={n_prompts} max_new_tokens={max_new_tokens} gamma={gamma} "
               f"temperature={temperature} (greedy at 0) cuda_graphs={decoder.cuda_graphs} "
               f"device_rounds={rows[1]['device_rounds']}")
    click.echo(results_table(rows))
    if json_path:
        report = {"device": device, "target": str(decoder.target_spec.model_dir),
                  "draft": str(decoder.draft_spec.model_dir), "batch": n_prompts, "max_new_tokens": max_new_tokens,
                  "gamma": gamma, "temperature": temperature, "seed": seed, "repeats": repeats,
                  "cuda_graphs": decoder.cuda_graphs, "device_rounds": device_rounds,
                  "results": rows}
        with open(json_path, "w") as f:
            json.dump(report, f, indent=2)
        click.echo(f"wrote {json_path}")
