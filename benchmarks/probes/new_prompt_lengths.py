"""What a request pays the first time its prompt length is seen: one decoder per folder, each prompt
length decoded twice (different token ids), the wall time of the first against the second. Lengths
up to sessions_static.MAX_GRAPH_STEPS + 1 prefill in one captured-size run; longer ones in runs that
are bound afresh. With --no-capture the sessions capture nothing after the warm-up (the loop's own step
counts are captured by then), which tells the capture's share from ONNX Runtime's own first run at a
new shape.

    python benchmarks/probes/new_prompt_lengths.py NAME=TARGET_DIR,DRAFT_DIR ... [--lengths 6,9,14,22,40,90]
                                                   [--new-tokens 16] [--gamma 0] [--no-capture]
                                                   [--split-prefill] [--json F]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def split_prefill(Requests) -> None:
    """Prefill runs of power-of-two column counts only (the largest that fits what is left, so a
    prompt takes at most log2 runs), in place of one run of any count: a probe of its cost."""

    def prefill_chunks(self, n_cached, chunk, only=None):
        n_cached = np.array(n_cached, np.int64)
        while True:
            need = np.minimum(self.seq_len - 1, n_cached + chunk) - n_cached
            rows = need > 0 if only is None else (need > 0) & only
            if not rows.any():
                return
            step = 1 << (int(need[rows].max()).bit_length() - 1)
            upto = n_cached + np.minimum(need, step)
            yield self.columns(n_cached, upto, rows=rows)
            n_cached = np.where(rows, upto, n_cached)
    Requests.prefill_chunks = prefill_chunks


def first_and_again(decoder, lengths, new_tokens: int, gamma: int, vocab: int) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for length in lengths:
        walls = []
        for _ in range(2):
            ids = rng.integers(100, vocab - 100, length).tolist()
            start = time.perf_counter()
            decoder.generate(prompt_ids=[ids], max_new_tokens=new_tokens, gamma=gamma,
                             method="greedy" if gamma else "target", temperature=0, ignore_eos=True)
            walls.append((time.perf_counter() - start) * 1e3)
        rows.append({"prompt_length": length, "first_ms": round(walls[0], 2), "again_ms": round(walls[1], 2)})
        print(f"  L = {length:3d}: first {walls[0]:8.2f} ms, again {walls[1]:8.2f} ms", flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", help="NAME=TARGET_DIR,DRAFT_DIR")
    parser.add_argument("--lengths", default="6,9,14,22,40,90")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--gamma", type=int, default=0)
    parser.add_argument("--no-capture", action="store_true")
    parser.add_argument("--split-prefill", action="store_true", help="power-of-two prefill runs (split_prefill)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a check of the script")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import onnxruntime
    if args.device == "cuda":
        onnxruntime.preload_dlls()
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    if args.split_prefill:
        from specsample_cupy.decode.request_state import Requests
        split_prefill(Requests)

    lengths = [int(x) for x in args.lengths.split(",")]
    report = {"new_tokens": args.new_tokens, "gamma": args.gamma, "capture": not args.no_capture,
              "split_prefill": args.split_prefill, "folders": {}}
    for spec in args.folders:
        name, dirs = spec.split("=", 1)
        target, draft = dirs.split(",")
        decoder = SpeculativeDecoder(Path(target), Path(draft), device=args.device)
        decoder.time_model_runs = False
        warm = list(range(200, 205))
        for _ in range(2):   # the loop's own step counts captured, the auto-gamma costs calibrated
            decoder.generate(prompt_ids=[warm], max_new_tokens=args.new_tokens, gamma=args.gamma,
                             method="greedy" if args.gamma else "target", temperature=0, ignore_eos=True)
        if args.no_capture:
            for session in (decoder.target, decoder.draft):
                if hasattr(session, "capture"):   # a StaticDecoderSession
                    session.capture = False
        print(name, decoder.cuda_graphs, flush=True)
        report["folders"][name] = first_and_again(decoder, lengths, args.new_tokens, args.gamma,
                                                  decoder.target_spec.vocab_size)
        del decoder
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
