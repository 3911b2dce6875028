"""`specsample bench decode`: end-to-end speed of each method against target-only decoding, at equal work.

Every call generates exactly max_new_tokens per request (EOS ignored) through the same loop (the
device loop on CUDA, the host loop on the CPU), and the benchmark checks that every method generated
the same number of tokens. Each configuration (batch, method, gamma) runs once per seed, twice:

- untimed (no CUDA events per run): its wall time gives the measured speed-up, target-only's wall
  over the method's, per seed;
- timed (CUDA events around every model run and verify()): its model and verify GPU time give the
  ideal speed-up, target-only's model time over the method's model + verify time (what a loop with
  no overhead would reach with the acceptance measured), and the overhead per round
  (wall - model - verify). The events' own cost is the timed call's wall minus the untimed one's.

Rows report the median and min-max over seeds and efficiency = measured / ideal. Target-only runs
once more after every configuration; its row's "drift" (the second wall time over the first, per seed)
says whether the machine or the process held steady over the run that the speed-ups compare across.

Every batch size draws its prompts from one set, the largest batch's (prompt_set): a batch of B
takes B consecutive prompts of it, starting at seed * B, so B = 1 runs a different prompt per seed
and, over the seeds, the same prompts a batch of four decodes together (one prompt that happens to
suit the draft does not decide the single-request figures).
"""
from __future__ import annotations

import itertools
import statistics

import click

from specsample_cupy.bench import result_json
from specsample_cupy.cli.decode import CONTEXT_SETTINGS, draft_options, load_decoder, resolve_device
from specsample_cupy.decode.ngram import NGRAM
from specsample_cupy.verification.api import ONEHOT_METHODS

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

# Input-grounded prompts (--workload grounded): code followed by the start of its own copy, so the
# continuation largely re-emits text the prompt holds (what prompt lookup drafts well).
_GROUNDED_SOURCES = (
    "def clamp(value, low, high):\n    if value < low:\n        return low\n    if value > high:\n"
    "        return high\n    return value\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
    "        self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n",
    "def read_lines(path):\n    with open(path) as f:\n        for line in f:\n            line = line.strip()\n"
    "            if line:\n                yield line\n",
    "def merge(a, b):\n    out = dict(a)\n    for key, value in b.items():\n        if key in out:\n"
    "            out[key] = out[key] + value\n        else:\n            out[key] = value\n    return out\n",
)
GROUNDED_PROMPTS = tuple(f"{src}\n\n# The same, again:\n{src.splitlines()[0]}\n" for src in _GROUNDED_SOURCES)
WORKLOADS = {"code": DEFAULT_PROMPTS, "grounded": GROUNDED_PROMPTS}


def _call(decoder, prompts, method, gamma, temperature, seed, max_new_tokens, timed):
    decoder.time_model_runs = timed
    try:
        out = decoder.generate(prompts, max_new_tokens=max_new_tokens, gamma=0 if method == "target" else gamma,
                               method=method, temperature=0.0 if method == "greedy" else temperature, seed=seed,
                               ignore_eos=True)
    finally:
        decoder.time_model_runs = True
    expected = len(prompts) * max_new_tokens
    if out.stats["generated_tokens"] != expected:
        raise RuntimeError(f"{method} gamma={gamma} seed={seed} generated {out.stats['generated_tokens']} tokens, "
                           f"not {expected}: the comparison would not be at equal work")
    return out.stats


def prompt_set(batches, prompts=DEFAULT_PROMPTS) -> list[str]:
    """The prompts every batch size draws from: as many as the largest batch (`prompts` cycled)."""
    return list(itertools.islice(itertools.cycle(prompts), max(batches)))


def prompts_for(prompt_set, batch: int, seed: int) -> list[str]:
    """The batch's prompts for one seed: `batch` consecutive prompts of the set from seed * batch, cycled."""
    start = seed * batch
    return [prompt_set[(start + i) % len(prompt_set)] for i in range(batch)]


def measure(decoder, prompts_of, method, gamma, *, temperature, seeds, max_new_tokens):
    """Per seed: an untimed call and a timed call of the same request (prompts_of(seed)). Returns the
    raw numbers."""
    runs = []
    for seed in seeds:
        prompts = prompts_of(seed)
        untimed = _call(decoder, prompts, method, gamma, temperature, seed, max_new_tokens, False)
        timed = _call(decoder, prompts, method, gamma, temperature, seed, max_new_tokens, True)
        runs.append({
            "seed": seed, "wall_s": untimed["wall_s"], "wall_timed_s": timed["wall_s"],
            "model_s": timed["model_time_s"], "verify_s": timed["verify_time_s"], "rounds": timed["rounds"],
            "acceptance_rate": timed["acceptance_rate"], "mean_gamma": timed["mean_gamma"],
            "overhead_per_round_s": timed["host_overhead_per_round_s"],
            "events_per_round_s": (timed["wall_s"] - untimed["wall_s"]) / max(timed["rounds"], 1),
            "loop": timed["loop"]})
    return runs


def rows_against_target(target_runs, configs, cuda_events: bool = True):
    """One row per configuration: speed-up (measured, per seed), ideal, efficiency; medians and ranges.
    cuda_events False (the CPU): the ideal, efficiency and the events' cost are None, as they need
    device times that do not overlap the host's."""
    by_seed = {r["seed"]: r for r in target_runs}
    rows = []
    for (method, gamma), runs in configs:
        measured = [by_seed[r["seed"]]["wall_s"] / r["wall_s"] for r in runs]
        ideal = [by_seed[r["seed"]]["model_s"] / (r["model_s"] + r["verify_s"]) for r in runs]
        efficiency = [m / i for m, i in zip(measured, ideal)]
        rows.append({
            "method": method, "gamma": gamma, "speedup": result_json.median_range(measured),
            "ideal": result_json.median_range(ideal) if cuda_events else None,
            "efficiency": result_json.median_range(efficiency) if cuda_events else None,
            "ms_per_token": result_json.median_range([1e3 * r["wall_s"] / r["tokens_per_request"] for r in runs]),
            "acceptance_rate": statistics.median(r["acceptance_rate"] for r in runs),
            "mean_gamma": statistics.median(r["mean_gamma"] for r in runs),
            "overhead_per_round_us": statistics.median(1e6 * r["overhead_per_round_s"] for r in runs),
            "events_per_round_us": statistics.median(1e6 * r["events_per_round_s"] for r in runs)
            if cuda_events else None,
            "loop": runs[0]["loop"], "tokens_per_request": runs[0]["tokens_per_request"], "runs": runs})
    return rows


def run_bench(decoder, prompts_of, *, methods, gammas, temperature, seeds, max_new_tokens, progress=None):
    """Target-only and every (method, gamma) over the same seeds, each seed with the same prompts
    (prompts_of(seed)) for every configuration (module docstring). gammas: ints and/or "auto".
    Returns the rows; the first is target-only against itself, with "drift": target-only measured
    once more after every configuration, its wall time over the first's per seed (median and range;
    1 when the machine and process held steady over the run)."""
    configs = [("target", 0)] + [(m, g) for m in methods if m != "target" for g in gammas]
    # Warm-up with the measured shapes: kernel compilation, ONNX Runtime's first runs, graph captures
    # and the auto policy's calibration happen here. Auto gamma visits the step counts its seed's
    # acceptance leads to, so it warms up on every seed (a step count first met in a measured call
    # would time its graph capture).
    for method, gamma in configs:
        for seed in (seeds if gamma == "auto" else seeds[:1]):
            _call(decoder, prompts_of(seed), method, gamma, temperature, seed, max_new_tokens, True)
    measured = []
    for method, gamma in (progress(configs) if progress else configs):
        runs = measure(decoder, prompts_of, method, gamma, temperature=temperature, seeds=seeds,
                       max_new_tokens=max_new_tokens)
        for r in runs:
            r["tokens_per_request"] = max_new_tokens
        measured.append(((method, gamma), runs))
    again = [_call(decoder, prompts_of(r["seed"]), "target", 0, temperature, r["seed"], max_new_tokens,
                   False)["wall_s"] / r["wall_s"] for r in measured[0][1]]   # untimed, as the speed-ups
    rows = rows_against_target(measured[0][1], measured, cuda_events=decoder.device == "cuda")
    rows[0]["drift"] = result_json.median_range(again)
    return rows


def _cell(value, fmt, median=True):
    if value is None:
        return "n/a"
    return fmt.format(value["median"] if median else value)


def results_table(rows) -> str:
    head = ("method", "gamma", "speed-up (median [min-max])", "ideal", "efficiency", "ms/token", "accept",
            "mean γ", "overhead/round µs", "events/round µs")
    cells = [head] + [(
        r["method"], str(r["gamma"]),
        f"{r['speedup']['median']:.2f}x [{r['speedup']['min']:.2f}-{r['speedup']['max']:.2f}]",
        _cell(r["ideal"], "{:.2f}x"), _cell(r["efficiency"], "{:.3f}"), f"{r['ms_per_token']['median']:.3f}",
        f"{r['acceptance_rate']:.3f}", f"{r['mean_gamma']:.2f}", f"{r['overhead_per_round_us']:.1f}",
        _cell(r["events_per_round_us"], "{:.1f}", median=False)) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells)


def plot(report: dict, path: str):
    """Speed-up vs gamma per method and batch (median, min-max bars), with the ideal curve."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = report["runs"]
    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 4), squeeze=False)
    for ax, run in zip(axes[0], runs):
        for method in sorted({r["method"] for r in run["rows"]} - {"target"}):
            rows = [r for r in run["rows"] if r["method"] == method and r["gamma"] != "auto"]
            g = [r["gamma"] for r in rows]
            med = [r["speedup"]["median"] for r in rows]
            err = [[m - r["speedup"]["min"] for m, r in zip(med, rows)], [r["speedup"]["max"] - m for m, r in zip(med, rows)]]
            line = ax.errorbar(g, med, yerr=err, marker="o", capsize=3, label=f"{method} measured")
            if rows and rows[0]["ideal"] is not None:   # CUDA events: none on the CPU
                ax.plot(g, [r["ideal"]["median"] for r in rows], ls="--", color=line[0].get_color(),
                        label=f"{method} ideal")
            auto = [r for r in run["rows"] if r["method"] == method and r["gamma"] == "auto"]
            if auto:
                ax.axhline(auto[0]["speedup"]["median"], ls=":", color=line[0].get_color(), label=f"{method} auto γ")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set(title=f"{report['pair']}, B = {run['batch']}, T = {report['temperature']}", xlabel="γ",
               ylabel="speed-up vs target-only (wall)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    # A 64-colour palette: a few lines and labels lose nothing, and the committed plots stay small.
    from PIL import Image
    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=64)
    small.save(path, optimize=True)


def _gammas(text):
    return [g if g == "auto" else int(g) for g in text.split(",") if g]


@click.command("decode", context_settings=CONTEXT_SETTINGS)
@click.option("--pair", default="embedded", show_default=True,
              help="embedded, cost-1.5b or cost-7b (models/build_cost_pair.py: the embedded pair with "
                   "zero-output ballast), or real-1.5b, real-7b, real-1.5b-self, real-7b-self "
                   "(models/build_real_pair.py: random checkpoints at Qwen2.5 shapes, converted); "
                   "built and cached on first use.")
@click.option("--draft-scale", default=1.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="real-* pairs: the draft's final-norm scale (self-drafting pairs: 1 gives the target's "
                   "distribution, other values lower acceptance at T > 0).")
@click.option("--attention", type=click.Choice(["onnx", "gqa"]), default="onnx", show_default=True,
              help="real-* pairs: the converted graphs' attention layout (convert --attention; gqa: one prompt "
                   "per call, CUDA).")
@click.option("--pairs-dir", type=click.Path(file_okay=False), default=None,
              help="Where cost-realistic pairs are built and cached (default ~/.cache/specsample/pairs).")
@click.option("--target", type=click.Path(exists=True, file_okay=False), default=None,
              help="Target model directory (instead of --pair).")
@draft_options
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default=None,
              help="Default: cuda when usable, else cpu.")
@click.option("--workload", type=click.Choice(sorted(WORKLOADS)), default="code", show_default=True,
              help="code: starts of code (the output is new text); grounded: code followed by the start of "
                   "its own copy (the output largely re-emits the prompt).")
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--methods", default="exact,greedy", show_default=True, help="Compared with target-only.")
@click.option("--gamma", "gammas", default="3,5,auto", show_default=True, help="Comma-separated; 'auto' too.")
@click.option("--batch", "batches", default="1,4", show_default=True,
              help="Batch sizes; each draws its prompts from the largest batch's set (B = 1: one per seed).")
@click.option("--temperature", default=1.0, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option("--seeds", default=5, show_default=True, type=click.IntRange(min=1), help="Seeds 0..N-1.")
@click.option("--ignore-eos/--stop-at-eos", default=True, show_default=True,
              help="Equal work: every request generates exactly --max-new-tokens.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="PNG: speed-up vs gamma per method with the ideal curve.")
def bench_decode(pair, attention, pairs_dir, draft_scale, target, draft, ngram_min, ngram_max, device, workload, max_new_tokens, methods,
                 gammas, batches, temperature, seeds, ignore_eos, json_path, plot_path):
    """Speed-up over target-only at equal work: median and range over seeds, ideal and efficiency."""
    from tqdm import tqdm
    if not ignore_eos:
        raise click.UsageError("bench decode compares equal work only: every request must generate "
                               "--max-new-tokens tokens (--ignore-eos)")
    device = resolve_device(device)
    ngram = draft == NGRAM
    if ngram and set(methods.split(",")) - set(ONEHOT_METHODS):
        raise click.UsageError(f"--draft ngram verifies one-hot drafts: --methods from {', '.join(ONEHOT_METHODS)}")
    if target is None and (draft is None or ngram) and pair != "embedded":
        from pathlib import Path

        from specsample_cupy.runtime.layout import models_module
        build_cost_pair, build_real_pair = models_module("build_cost_pair"), models_module("build_real_pair")
        root = Path(pairs_dir) if pairs_dir else build_cost_pair.default_root()
        if pair in build_real_pair.PAIRS:
            target, built_draft = build_real_pair.build_pair(
                pair, root, dtype="float16" if device == "cuda" else "float32", draft_scale=draft_scale,
                attention=attention)
        else:
            target, built_draft = build_cost_pair.build_pair(pair, root, check="cuda" if device == "cuda" else "cpu")
        draft = draft if ngram else built_draft
    batches = [int(b) for b in batches.split(",") if b]
    decoder = load_decoder(target, draft, device, ngram_min=ngram_min, ngram_max=ngram_max,
                           batch_layout=max(batches, default=1) > 1)
    methods = [m for m in methods.split(",") if m]
    report = {"pair": pair if target is None or pair != "embedded" else "custom", "workload": workload,
              "target": str(decoder.target_spec.model_dir),
              "draft": f"ngram {ngram_min}..{ngram_max}" if ngram else str(decoder.draft_spec.model_dir),
              "device": device, "max_new_tokens": max_new_tokens, "temperature": temperature,
              "seeds": seeds, "cuda_graphs": decoder.cuda_graphs, "draft_scale": draft_scale, "runs": []}
    if device == "cuda":
        report["gpu"] = result_json.gpu_name()
    if pair.startswith("real-"):
        report["attention"] = attention
    prompts = prompt_set(batches, WORKLOADS[workload])
    report["prompts"] = prompts
    for batch in batches:
        rows = run_bench(decoder, lambda seed, batch=batch: prompts_for(prompts, batch, seed), methods=methods,
                         gammas=_gammas(gammas), temperature=temperature,
                         seeds=list(range(seeds)), max_new_tokens=max_new_tokens,
                         progress=lambda c: tqdm(c, desc=f"B={batch}", leave=False))
        click.echo(f"pair={report['pair']} device={device} batch={batch} max_new_tokens={max_new_tokens} "
                   f"temperature={temperature} (greedy at 0) seeds={seeds} loop={rows[0]['loop']}")
        click.echo(results_table(rows))
        drift = rows[0]["drift"]
        click.echo(f"target-only again after the rest: {drift['median']:.3f}x the first's wall time "
                   f"[{drift['min']:.3f}-{drift['max']:.3f}]")
        report["runs"].append({"batch": batch, "rows": rows})
    if json_path:
        result_json.write(json_path, report)
        click.echo(f"wrote {json_path}")
    if plot_path:
        plot(report, plot_path)
        click.echo(f"wrote {plot_path}")
