"""The device loop on the tiny test pair (speculative rounds at fixed and automatic gamma, target-only
steps, prompt-lookup drafts, truncated sampling), for compute-sanitizer restricted to decode_round.cu's,
ngram.cu's and warp_rows.cu's kernels (ONNX Runtime's own kernels run unchecked):

    compute-sanitizer --tool memcheck --kernel-name kns=draft_step_done --kernel-name kns=round_done \\
        --kernel-name kns=compact_plan --kernel-name kns=target_step_done \\
        --kernel-name kns=ngram_propose --kernel-name kns=ngram_target_feed --kernel-name kns=warp_rows_kernel \\
        python3 benchmarks/sanitize_decode_round.py
Exits non-zero if a request's tokens break the budget/EOS rules or leave the vocabulary.
"""
import sys
import tempfile

from models.build_tiny import build_tiny_pair
from specsample_cupy.decode.decoder import SpeculativeDecoder

pair = build_tiny_pair(tempfile.mkdtemp(), vocab_size=48, seed=3)
model_draft = SpeculativeDecoder(*pair, device="cuda")
lookup = SpeculativeDecoder(pair[0], draft="ngram", device="cuda")
prompts = ["the rain in spain", "a", "hello there, a longer prompt the rain in spain"]
bad = 0
truncation = dict(top_k=6, top_p=0.9, min_p=0.02)
for dec, eos, max_new, gamma, warp in ((model_draft, (0,), 70, 4, {}), (model_draft, (0, 5, 7), 40, 2, {}),
                                       (model_draft, (0, 5, 7), 40, 0, {}), (model_draft, (0,), 40, "auto", {}),
                                       (lookup, (0,), 70, 4, {}), (lookup, (0, 5, 7), 40, "auto", {}),
                                       (model_draft, (0,), 40, 3, truncation), (model_draft, (0,), 30, 0, truncation),
                                       (lookup, (0,), 30, 3, truncation)):
    dec.target_spec.eos_token_ids = eos
    out = dec.generate(prompts, max_new_tokens=max_new, gamma=gamma, method="exact" if gamma else "target",
                       temperature=1.0, seed=5, **warp)
    assert out.stats["device_rounds"] is True, out.stats["device_rounds"]
    for ids in out.token_ids:
        ends = [j for j, t in enumerate(ids) if t in eos]
        ok = all(0 <= t < 48 for t in ids) and (ends == [len(ids) - 1] or (not ends and len(ids) == max_new))
        bad += not ok
    print(f"eos {eos}: lengths {[len(t) for t in out.token_ids]}, compactions {out.stats['kv_compactions']}")
print("bad requests:", bad)
sys.exit(1 if bad else 0)
