"""Models as users have them, through the device loop on CUDA: one real-shape self-drafting pair
(models/build_real_pair.py, random weights, float16) in five folder formats, decoded target-only and
greedy speculative at equal work (bench decode's run_bench: 128 tokens per request, EOS ignored, seeds
0..N-1), each format's time per token beside the converted format's from the same run. The converted format
runs first and again last ("converted-again"): what it gains or loses between the two is the call's
drift, not a format's. Each format runs in a process of its own, nvidia-smi's clocks, temperature and
power recorded before and after it ("gpu_state").

    format         folder                                                    how it loads
    converted      specsample convert (ONNX Attention over a masked cache)   as it is
    converted-gqa  specsample convert --attention gqa                        as it is (one prompt at a time:
                                                                             a batch runs prompt by prompt)
    builder        converted-gqa laid out as ONNX Runtime GenAI's builder     rewritten once for fixed bindings
                   writes it (models/tool_layouts.builder_folder)             (one prompt at a time)
    builder-       the checkpoint's weights as the builder names them         as it is; its conversion's time
    converted      (tool_layouts.builder_export), then specsample convert     is the format's conversion_s
                   (what a builder folder opened for batches loads: the CLI
                   at B > 1, SpeculativeDecoder(batch_layout=True))
    optimum        the checkpoint's weights as optimum exports them           converted once into the cache
                   (models/tool_layouts.optimum_export, external data)

The builder folder is the project's GroupQueryAttention graph with the builder's conventions (total
length from the mask's shape, genai_config.json, no config.json), not the builder's own output; the
optimum folder holds the export's weights as torch.onnx names them. Both measure the loading paths
(what a user's folder runs as), and the first load's time, which includes the rewrite or conversion.

    python benchmarks/formats.py --work DIR [--pair real-1.5b-self] [--batches 1,4] [--seeds 5] [--json F]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build_formats(work: Path, pair: str, seed: int = 0, conversion_s: dict | None = None) -> dict[str, tuple]:
    """{format: (target, draft)} under work, each built once (a folder is complete once it exists);
    conversion_s gets builder-converted's conversion seconds per role when this call converts."""
    import numpy as np

    from models import build_real_pair, tool_layouts
    from specsample_cupy.convert import convert

    hf, made, conversion_s = work / "hf", {}, {} if conversion_s is None else conversion_s
    if not (hf / "draft" / "config.json").exists():
        shutil.rmtree(hf, ignore_errors=True)
        build_real_pair.write_pair_checkpoints(pair, hf, dtype="float16", seed=seed)

    def builder_converted(src, dst, role):
        export = work / "builder-export" / role
        if not export.exists():
            shutil.rmtree(export.with_name(role + ".partial"), ignore_errors=True)
            tool_layouts.builder_export(src, export.with_name(role + ".partial"), dtype=np.float16, external=True)
            export.with_name(role + ".partial").rename(export)
        start = time.perf_counter()
        convert(export, dst)
        conversion_s[role] = time.perf_counter() - start

    for fmt, make in (
            ("converted", lambda src, dst, role: convert(src, dst, attention="onnx")),
            ("converted-gqa", lambda src, dst, role: convert(src, dst, attention="gqa")),
            ("builder", lambda src, dst, role: tool_layouts.builder_folder(work / "converted-gqa" / role, dst)),
            ("optimum", lambda src, dst, role: tool_layouts.optimum_export(src, dst, dtype=np.float16,
                                                                           external=True)),
            ("builder-converted", builder_converted)):
        for role in ("target", "draft"):
            dst = work / fmt / role
            if not dst.exists():
                tmp = dst.with_name(role + ".partial")
                shutil.rmtree(tmp, ignore_errors=True)
                make(hf / role, tmp, role)
                tmp.rename(dst)
        made[fmt] = (work / fmt / "target", work / fmt / "draft")
    return made


def bench_format(target: Path, draft: Path, batches, seeds: int, max_new_tokens: int, gammas,
                 device: str = "cuda") -> dict:
    from specsample_cupy.bench.decode import DEFAULT_PROMPTS, prompt_set, prompts_for, run_bench
    from specsample_cupy.cli.decode import load_decoder

    from specsample_cupy.decode.one_at_a_time import one_prompt_reason

    start = time.perf_counter()
    decoder = load_decoder(target, draft, device)
    report = {"first_load_s": time.perf_counter() - start, "cuda_graphs": decoder.cuda_graphs,
              "one_prompt_at_a_time": one_prompt_reason(decoder, True), "runs": []}
    prompts = prompt_set(batches, DEFAULT_PROMPTS)
    for batch in batches:
        rows = run_bench(decoder, lambda seed, batch=batch: prompts_for(prompts, batch, seed), methods=["greedy"],
                         gammas=gammas, temperature=1.0, seeds=list(range(seeds)), max_new_tokens=max_new_tokens)
        report["runs"].append({"batch": batch, "rows": rows})
    return report


def gpu_state() -> str | None:
    """nvidia-smi's SM and memory clocks, temperature and power now (None without nvidia-smi): beside
    each format, so that a drift over the call can be told from the card's state."""
    import subprocess
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def bench_in_process(fmt: str, args, batches, gammas) -> dict:
    """bench_format() of one format in a fresh process (what an earlier format's decoder left behind,
    memory or caches, cannot slow it), with the card's state before and after."""
    import json
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "format.json"
        before = gpu_state()
        subprocess.run([sys.executable, __file__, "--work", str(args.work), "--pair", args.pair, "--seeds",
                        str(args.seeds), "--max-new-tokens", str(args.max_new_tokens), "--batches",
                        ",".join(map(str, batches)), "--gammas", ",".join(map(str, gammas)), "--one-format",
                        fmt, "--one-format-json", str(out), "--device", args.device], check=True)
        return {**json.loads(out.read_text()), "gpu_state": [before, gpu_state()]}


def table(report: dict) -> str:
    """ms per token (median [min-max] over seeds) and the ratio to the converted format's median, from
    the report as stored (without_seed_runs)."""
    base = {(run["batch"], r["method"], r["gamma"]): r["ms_per_token"]["median"]
            for run in report["formats"].get("converted", {}).get("runs", []) for r in run["rows"]}
    lines = [f"{'format':14} {'B':>2} {'config':>10} {'ms/token':>22} {'x converted':>11} {'efficiency':>10} loop"]
    for fmt, result in report["formats"].items():
        for run in result["runs"]:
            for r in run["rows"]:
                config = "target" if r["method"] == "target" else f"greedy γ{r['gamma']}"
                ms = r["ms_per_token"]
                ratio = ms["median"] / base.get((run["batch"], r["method"], r["gamma"]), float("nan"))
                eff = "" if r["method"] == "target" or r["efficiency"] is None else f"{r['efficiency']:.3f}"
                lines.append(f"{fmt:14} {run['batch']:>2} {config:>10} {ms['median']:8.3f} "
                             f"[{ms['min']:.3f}-{ms['max']:.3f}] {ratio:11.3f} {eff:>10} {r['loop']}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--pair", default="real-1.5b-self")
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--gammas", default="4,auto")
    parser.add_argument("--formats", default="converted,converted-gqa,builder,optimum,builder-converted")
    parser.add_argument("--json", default=None)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: the host loop, for checks")
    parser.add_argument("--build-only", action="store_true", help="write the folders and stop")
    parser.add_argument("--one-format", help=argparse.SUPPRESS)   # bench_in_process's child
    parser.add_argument("--one-format-json", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_format:
        folder = args.one_format.removesuffix("-again")
        from specsample_cupy.bench import result_json
        result = bench_format(*build_formats(args.work, args.pair)[folder], [int(b) for b in args.batches.split(",")],
                              args.seeds, args.max_new_tokens,
                              [g if g == "auto" else int(g) for g in args.gammas.split(",")], args.device)
        result_json.write(args.one_format_json, result)
        return
    if args.build_only:
        for fmt, (target, draft) in build_formats(args.work, args.pair).items():
            print(fmt, target, draft)
        return
    from specsample_cupy.bench import result_json

    batches = [int(b) for b in args.batches.split(",")]
    gammas = [g if g == "auto" else int(g) for g in args.gammas.split(",")]
    conversion_s = {}
    build_formats(args.work, args.pair, conversion_s=conversion_s)   # each format's process then finds it
    report = {"pair": args.pair, "max_new_tokens": args.max_new_tokens, "seeds": args.seeds,
              "gpu": result_json.gpu_name(0) if args.device == "cuda" else None, "formats": {},
              "command": "python benchmarks/formats.py " + " ".join(sys.argv[1:])}
    order = args.formats.split(",")
    if len(order) > 1 and order[0] == "converted":
        order.append("converted-again")   # the baseline once more, last: drift over the call shows
    for fmt in order:
        try:
            report["formats"][fmt] = bench_in_process(fmt, args, batches, gammas)
            if fmt == "builder-converted" and conversion_s:   # converted in this run
                report["formats"][fmt]["conversion_s"] = conversion_s
        except Exception as exc:  # noqa: BLE001 - a format that fails is reported, the others still run
            report["formats"][fmt] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}", "runs": []}
        print(fmt, {k: v for k, v in report["formats"][fmt].items() if k != "runs"}, flush=True)
        if args.json:   # after each format: a run cut short keeps what it measured
            result_json.write(args.json, without_seed_runs(report))
    print(table(without_seed_runs(report)))


def without_seed_runs(report: dict) -> dict:
    """The report as stored: per row the time per token (median and range over seeds), the medians of
    speed-up, ideal and efficiency, the tokens every request generated (equal work) and the loop; not
    the per-seed runs."""
    def kept(r):
        medians = {k: r[k] and r[k]["median"] for k in ("speedup", "ideal", "efficiency")}   # CPU: no ideal
        return {"method": r["method"], "gamma": r["gamma"], "ms_per_token": r["ms_per_token"], **medians,
                "overhead_per_round_us": r["overhead_per_round_us"], "tokens_per_request": r["tokens_per_request"],
                "loop": r["loop"], **({"drift": r["drift"]} if "drift" in r else {})}
    formats = {fmt: {**result, "runs": [{**run, "rows": [kept(r) for r in run["rows"]]} for run in result["runs"]]}
               for fmt, result in report["formats"].items()}
    return {**report, "formats": formats}


if __name__ == "__main__":
    main()
