"""Per-round records and stop strings for the task evaluations, through generate()'s on_round hook.

The evaluations need, for every verification round, its time and how many draft tokens were proposed
and accepted; generate() reports totals, each round's verify time (stats["verify_times_s"]) and
calls on_round after each round the host reads. ``StepRecorder`` adds:

* stats["draft_lengths"], stats["accepted_per_round"]: per speculative round, summed over the batch
  (the evaluations decode one item per call, so these are that item's numbers);
* stop_strings: passed to generate()'s stop (specsample_cupy/decode/stop_strings.py);
* prompts given as token-id lists (Whisper's forced decoder prefix).
"""
from __future__ import annotations

import numpy as np


class StepRecorder:
    """Mixin for SpeculativeDecoder: ``generate`` adds per-round lists to ``stats``."""

    def generate(self, prompts, *args, stop_strings=(), **kwargs):
        draft_log, accept_log = [], []

        def on_round(rnd, req):
            if rnd.gamma:
                draft_log.append(int(rnd.draft_len[rnd.active].sum()))
                accept_log.append(int(np.where(rnd.active, rnd.accepted, 0).sum()))
            return None

        out = super().generate(prompts, *args, on_round=on_round, stop=tuple(s for s in stop_strings if s), **kwargs)
        out.stats["verify_times_s"] = out.stats.get("verify_times_s") or []
        out.stats["draft_lengths"] = draft_log
        out.stats["accepted_per_round"] = accept_log
        return out

    def encode_prompts(self, prompts):
        if all(isinstance(p, (list, tuple)) for p in prompts):
            ids = [[int(t) for t in p] for p in prompts]
            for i, p in enumerate(ids):
                if not p:
                    raise ValueError(f"prompt {i} is empty")
                if self.context_length and len(p) >= self.context_length:
                    raise ValueError(f"prompt {i} has {len(p)} tokens; the models' context holds "
                                     f"{self.context_length}, leaving no room to generate")
            return ids
        return super().encode_prompts(prompts)
