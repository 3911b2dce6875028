"""This project against ONNX Runtime GenAI's own loop, on the same files: one real-shape self-drafting
pair (models/build_real_pair.py, random weights) converted with GroupQueryAttention and laid out as
GenAI's builder writes its folders (models/tool_layouts.builder_folder), decoded at B = 1 by both:

    ours, as it comes   the builder folders, through SpeculativeDecoder (device loop, CUDA graphs)
    ours, converted     specsample convert's default layout of the same checkpoints
    genai               onnxruntime_genai.Generator on the builder folders, the draft named in
                        genai_config.json (model.draft), CUDA graphs enabled for both sessions

Equal work: each request is one of the first `seeds` prompts of bench decode's set, tokenised once and
given to both as token ids; 128 new tokens (EOS ignored: GenAI's min_length is its max_length), greedy.
The time is the request's wall time (prefill included) over the new tokens; median and range over the
prompts. The systems alternate, two rounds, so drift over the call shows as a difference between rounds.
Each system runs in a process of its own each round (GenAI's libonnxruntime beside this project's
onnxruntime module would be a second ONNX Runtime in one process, and a model held in memory while the
other runs would compete with it where memory is short).

    python benchmarks/genai_compare.py --work DIR [--pair real-1.5b-self] [--dtype float16] [--seeds 5]
                                       [--gammas 4,auto] [--device cuda] [--ours builder,converted]
                                       [--json F] [--build-only]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specsample_cupy.bench import result_json  # noqa: E402 - after the path the scripts run with

MAX_LENGTH = 256   # GenAI's fixed buffer (past/present capacity, the captured graph's shape)


def build(work: Path, pair: str, dtype: str) -> dict[str, Path]:
    """{"converted": dir, "builder": dir, "genai": dir} under work, each pair folder holding target/ and
    draft/; genai is the builder target's files with the draft under draft/, one genai_config.json."""
    from models import build_real_pair, tool_layouts
    from specsample_cupy.convert import convert

    hf = work / "hf"
    if not (hf / "draft" / "config.json").exists():
        shutil.rmtree(hf, ignore_errors=True)
        build_real_pair.write_pair_checkpoints(pair, hf, dtype=dtype)
    steps = (("converted", lambda role, dst: convert(hf / role, dst, dtype=dtype)),
             ("gqa", lambda role, dst: convert(hf / role, dst, dtype=dtype, attention="gqa")),
             ("builder", lambda role, dst: tool_layouts.builder_folder(work / "gqa" / role, dst)))
    for name, make in steps:
        for role in ("target", "draft"):
            dst = work / name / role
            if not dst.exists():
                shutil.rmtree(dst.with_name(role + ".partial"), ignore_errors=True)
                make(role, dst.with_name(role + ".partial"))
                dst.with_name(role + ".partial").rename(dst)
    genai = work / "genai"
    if not genai.exists():
        genai.mkdir()
        for f in (work / "builder" / "target").iterdir():
            (genai / f.name).symlink_to(f)
        (genai / "draft").symlink_to(work / "builder" / "draft")
    return {"converted": work / "converted", "builder": work / "builder", "genai": genai}


def write_genai_config(genai: Path, device: str) -> None:
    """genai_config.json for GenAI's loop: the target's, with the draft's decoder section as
    model.draft, a fixed max_length, greedy search, and on CUDA the CUDA provider with graph capture."""
    target = json.loads((genai.parent / "builder" / "target" / "genai_config.json").read_text())
    draft = json.loads((genai.parent / "builder" / "draft" / "genai_config.json").read_text())
    session = ({"provider_options": [{"cuda": {"enable_cuda_graph": "1"}}]} if device == "cuda" else {})
    target["model"]["decoder"]["session_options"] = session
    target["model"]["draft"] = {**draft["model"]["decoder"], "filename": "draft/model.onnx", "session_options": session}
    target["search"] = {"max_length": MAX_LENGTH, "min_length": MAX_LENGTH, "do_sample": False, "num_beams": 1,
                        "past_present_share_buffer": device == "cuda"}
    (genai / "genai_config.json").unlink(missing_ok=True)
    (genai / "genai_config.json").write_text(json.dumps(target, indent=1))


def genai_runner(genai: Path):
    """run(ids, new_tokens, k) -> (wall seconds, tokens, stats): GenAI's loop on one request; k = 0
    target-only, an int a fixed draft length, "auto" its adaptive draft length."""
    import numpy as np
    import onnxruntime_genai as og

    model = og.Model(str(genai))

    def run(ids, new_tokens, k):
        start = time.perf_counter()
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=MAX_LENGTH, min_length=MAX_LENGTH)
        if k == "auto":
            params.set_speculative_options(max_draft_tokens=12, min_adaptive_k=1)
        elif k:
            params.set_speculative_options(max_draft_tokens=k)
        generator = og.Generator(model, params)
        generator.append_tokens(np.asarray([ids], np.int32))
        for _ in range(new_tokens):
            generator.generate_next_token()
        tokens = list(generator.get_sequence(0))[len(ids):]
        wall = time.perf_counter() - start
        stats = {"loop": "GenAI's Generator"}
        if k:
            s = generator.get_speculative_stats()
            stats.update({key: s[key] for key in ("acceptance_rate", "rounds", "effective_k")})
        return wall, [int(t) for t in tokens], stats
    return run


def ours_runner(folder: Path, device: str):
    from specsample_cupy.cli.decode import load_decoder

    decoder = load_decoder(folder / "target", folder / "draft", device)
    decoder.time_model_runs = False

    def run(ids, new_tokens, k):
        start = time.perf_counter()
        out = decoder.generate(prompt_ids=[ids], max_new_tokens=new_tokens, gamma=k or 0,
                               method="greedy" if k else "target", temperature=0, ignore_eos=True)
        wall = time.perf_counter() - start
        return wall, out.token_ids[0], {"loop": out.stats["loop"], "acceptance_rate": out.stats["acceptance_rate"]}
    run.cuda_graphs = decoder.cuda_graphs
    return run


def measure(run, prompts, new_tokens, k) -> dict:
    run(prompts[0], new_tokens, k)   # warm-up: captures, allocations, the auto gamma's calibration
    walls, tokens, stats = [], [], []
    for ids in prompts:
        wall, out, s = run(ids, new_tokens, k)
        if len(out) != new_tokens:
            raise RuntimeError(f"generated {len(out)} tokens, not {new_tokens}: not equal work")
        walls.append(wall * 1e3 / new_tokens)
        tokens.append(out)
        stats.append(s)
    return {"ms_per_token": result_json.median_range(walls), "tokens_per_request": new_tokens, "stats": stats[0],
            "tokens": tokens}


def worker(job: Path) -> None:
    """One system's side of one round, in a process of its own (GenAI's libonnxruntime apart from this
    project's onnxruntime module, and neither system's memory held while the other runs): reads the
    job (system, folder, prompts, configs), writes {"results": {config: measure()}, "cuda_graphs"}."""
    spec = json.loads(job.read_text())
    import onnxruntime
    if spec["device"] == "cuda":
        onnxruntime.preload_dlls()
    if spec["system"] == "genai":
        run, graphs = genai_runner(Path(spec["folder"])), "enable_cuda_graph=1" if spec["device"] == "cuda" else False
    else:
        run = ours_runner(Path(spec["folder"]), spec["device"])
        graphs = run.cuda_graphs
    results = {str(k): measure(run, spec["prompts"], spec["new_tokens"], k) for k in spec["configs"]}
    job.with_suffix(".out.json").write_text(json.dumps({"results": results, "cuda_graphs": graphs}))


def in_process(system: str, folder: Path, device: str, prompts, new_tokens: int, configs, work: Path) -> dict:
    """worker() of one system in a fresh process: ({config: measure()}, its cuda_graphs)."""
    import subprocess

    job = work / "job.json"
    job.write_text(json.dumps({"system": system, "folder": str(folder), "device": device, "prompts": prompts,
                               "new_tokens": new_tokens, "configs": configs}))
    subprocess.run([sys.executable, __file__, "--worker", str(job)], check=True)
    out = json.loads(job.with_suffix(".out.json").read_text())
    return {k if k == "auto" else int(k): v for k, v in out["results"].items()}, out["cuda_graphs"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path)
    parser.add_argument("--pair", default="real-1.5b-self")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--gammas", default="4,auto")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ours", default="builder,converted",
                        help="which of our two folders run beside GenAI (builder: as it comes; converted)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--build-only", action="store_true", help="write the folders and stop")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    if args.work is None:
        parser.error("--work DIR is required")
    if args.build_only:
        print(build(args.work, args.pair, args.dtype))
        return
    import onnxruntime   # its version only: the models run in the workers

    from specsample_cupy.bench.decode import DEFAULT_PROMPTS
    from specsample_cupy.runtime.model_folder import ModelSpec

    folders = build(args.work, args.pair, args.dtype)
    write_genai_config(folders["genai"], args.device)
    tokenizer = ModelSpec.from_dir(folders["converted"] / "target").tokenizer
    prompts = [tokenizer.encode(p).ids for p in DEFAULT_PROMPTS[:args.seeds]]
    configs = [0] + [g if g == "auto" else int(g) for g in args.gammas.split(",")]
    names = {"builder": "ours, as it comes", "converted": "ours, converted"}
    systems = {"genai": ("genai", folders["genai"]),
               **{names[key]: ("ours", folders[key]) for key in args.ours.split(",")}}
    report = {"pair": args.pair, "dtype": args.dtype, "device": args.device, "max_new_tokens": args.max_new_tokens,
              "prompts": len(prompts), "command": "python benchmarks/genai_compare.py " + " ".join(sys.argv[1:]),
              "onnxruntime": onnxruntime.__version__, "rounds": [], "cuda_graphs": {}}
    try:
        from importlib.metadata import version
        package = "onnxruntime-genai-cuda" if args.device == "cuda" else "onnxruntime-genai"
        report["onnxruntime_genai"] = version(package)
    except ImportError:
        pass
    if args.device == "cuda":
        report["gpu"] = result_json.gpu_name(0)
    for r in range(args.rounds):
        results = {}
        for name, (system, folder) in systems.items():
            results[name], graphs = in_process(system, folder, args.device, prompts, args.max_new_tokens, configs,
                                               args.work)
            report["cuda_graphs"][name] = graphs
        rows = []
        for k in configs:
            for name in systems:
                res = results[name][k]
                same = res["tokens"] == results["genai"][k]["tokens"]
                rows.append({"system": name, "config": "target" if not k else f"greedy γ{k}",
                             "ms_per_token": res["ms_per_token"], "tokens_per_request": res["tokens_per_request"],
                             **res["stats"], "same_tokens_as_genai": same})
                ms = res["ms_per_token"]
                print(f"round {r} {name:18} {rows[-1]['config']:>11} {ms['median']:7.3f} "
                      f"[{ms['min']:.3f}-{ms['max']:.3f}] same tokens as genai: {same} {res['stats']}", flush=True)
        report["rounds"].append(rows)
        if args.json:
            result_json.write(args.json, report)


if __name__ == "__main__":
    main()
