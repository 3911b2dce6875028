"""SamplingSettings: one frozen object for what shapes a decoding call's tokens (as vLLM's SamplingParams),
checked once, here, with the checks generate() applies to its keyword arguments (decode/call_args.py,
decode/stop_strings.py, verify()'s truncation rule).

It travels from the user to the decoder and into the record of a `specsample generate` run:

    settings = SamplingSettings(method="exact", temperature=0.8, top_p=0.95, gamma="auto", max_new_tokens=128)
    out = decoder.generate(prompts, **settings.generate_kwargs())
    stream = decoder.generate_stream(requests, **settings.stream_kwargs())
    result = verify(draft_tokens, draft_logits, target_logits, **settings.verify_kwargs())
    settings.record()    # the "settings" fields of an output line; SamplingSettings.from_record() reads them

Keyword arguments of generate(), generate_stream() and verify() stay the documented way to call them;
this object is their one checked bundle. What depends on the models (the vocabulary: whether a top_k is
below it, and so active for a method that allows no truncation; token ids) is checked at the call.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from numbers import Integral

import numpy as np

from specsample_cupy.decode.call_args import check_call, resolve_temperature
from specsample_cupy.decode.stop_strings import check_stop_strings
from specsample_cupy.verification.truncation import make_warps

AUTO = "auto"
# The fields an output line's "settings" records, in the order it records them (batch/run_settings.py).
RECORDED = ("method", "gamma", "adaptive_gamma", "temperature", "max_new_tokens", "top_k", "top_p", "min_p",
            "stop", "seed")
_ANY_VOCAB = 2 ** 31 - 1   # the values' own checks, for any vocabulary size


@dataclass(frozen=True)
class SamplingSettings:
    """What a decoding call samples with; every field has generate()'s default and meaning.

    method: "exact", "sigmoid", "sigmoid-paper", "baseline", "greedy" (see verify()) or "target".
    temperature: of both models; None: 1, or 0 for "greedy" (which takes no other value). Stored resolved.
    top_k, top_p, min_p: truncated sampling (verify()'s rule); None: off.
    seed: the call's base seed (int), or None: drawn from the operating system at the call.
    gamma: draft tokens per round (int >= 0) or "auto"; adaptive_gamma: Hugging Face's +2/-1 heuristic;
        gamma_min, gamma_max: the range "auto" and adaptive gamma move in.
    stop: stop strings (a str or strings; stored as a tuple).
    max_new_tokens: tokens per request at most; logprobs: each token's log-probability; ignore_eos:
        generate exactly max_new_tokens.
    ValueError/TypeError naming the field for a bad value.
    """
    method: str = "exact"
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = 0
    gamma: int | str = 5
    adaptive_gamma: bool = False
    gamma_min: int = 1
    gamma_max: int = 12
    stop: tuple[str, ...] = ()
    max_new_tokens: int = 64
    logprobs: bool = False
    ignore_eos: bool = False

    def __post_init__(self):
        if not _is_int(self.max_new_tokens):
            raise ValueError(f"max_new_tokens must be an int >= 0, got {self.max_new_tokens!r}")
        if self.gamma != AUTO and not _is_int(self.gamma):
            raise ValueError(f"gamma must be an int >= 0 or 'auto', got {self.gamma!r}")
        check_call(self.method, self.max_new_tokens, 4 if self.gamma == AUTO else self.gamma, ngram=False)
        for name in ("gamma_min", "gamma_max"):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be an int >= 0, got {getattr(self, name)!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")
        for name in ("adaptive_gamma", "logprobs", "ignore_eos"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        temperature = resolve_temperature(self.method, self.temperature)
        object.__setattr__(self, "temperature", temperature)
        object.__setattr__(self, "stop", check_stop_strings(self.stop))
        make_warps(np, 1, _ANY_VOCAB, None, temperature, **self.truncation())   # the values' checks

    def truncation(self) -> dict:
        """top_k / top_p / min_p as keyword arguments, those given only."""
        return {k: v for k, v in (("top_k", self.top_k), ("top_p", self.top_p), ("min_p", self.min_p))
                if v is not None}

    def replace(self, **changes) -> SamplingSettings:
        """A copy with `changes` (checked again)."""
        return SamplingSettings(**{**asdict(self), **changes})

    def generate_kwargs(self) -> dict:
        """SpeculativeDecoder.generate()'s keyword arguments."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def stream_kwargs(self) -> dict:
        """SpeculativeDecoder.generate_stream()'s keyword arguments (each StreamRequest brings its own
        max_new_tokens and temperature; the stream takes a fixed gamma only)."""
        return dict(gamma=self.gamma, method=self.method, ignore_eos=self.ignore_eos, stop=self.stop,
                    logprobs=self.logprobs, seed=self.seed, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)

    def verify_kwargs(self) -> dict:
        """verify()'s keyword arguments (method "target" has none: it verifies nothing)."""
        if self.method == "target":
            raise ValueError("method 'target' decodes with the target alone: verify() takes no such method")
        return dict(method=self.method, temperature=self.temperature, seed=0 if self.seed is None else self.seed,
                    logprobs=self.logprobs, **self.truncation())

    def record(self) -> dict:
        """The fields an output line's "settings" holds (RECORDED, in that order; stop as a list)."""
        return {name: list(self.stop) if name == "stop" else getattr(self, name) for name in RECORDED}

    @classmethod
    def from_record(cls, record: dict, **rest) -> SamplingSettings:
        """The settings a record() (or an output line's "settings") holds; `rest` gives the fields a
        record leaves out (gamma_min, gamma_max, logprobs, ignore_eos)."""
        return cls(**{name: tuple(record[name]) if name == "stop" else record[name] for name in RECORDED}, **rest)


def _is_int(value) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)
