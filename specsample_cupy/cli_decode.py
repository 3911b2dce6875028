"""`specsample decode`: generate text with speculative decoding and print its statistics."""
from __future__ import annotations

import json
import warnings

import click

from specsample_cupy.decoder import METHODS

STATS_SHOWN = (
    ("method", "{}"), ("device", "{}"), ("gamma", "{}"), ("rounds", "{}"), ("generated_tokens", "{}"),
    ("acceptance_rate", "{:.3f}"), ("mean_accepted_per_round", "{:.2f}"), ("tokens_per_s", "{:.1f}"),
    ("verify_time_per_round_s", "{:.6f}"), ("model_time_s", "{:.4f}"),
    ("host_overhead_per_round_s", "{:.6f}"), ("wall_s", "{:.4f}"),
)


def stats_table(stats: dict) -> str:
    """The decode statistics as a two-column text table."""
    rows = [(key, fmt.format(stats[key])) for key, fmt in STATS_SHOWN if key in stats]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v:>12}" for k, v in rows)


def resolve_device(device: str | None) -> str:
    """The requested device, or "cuda" when usable and otherwise "cpu" (said on stderr)."""
    from specsample_cupy.sessions import cuda_available

    if device is None:
        if cuda_available():
            return "cuda"
        click.echo("No usable CUDA device (CuPy + onnxruntime-gpu); running on the CPU.", err=True)
        return "cpu"
    return device


class TextStream:
    """Prints each request's text as its tokens arrive; holds back an incomplete UTF-8 character."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.printed = tokenizer, [], 0

    def __call__(self, request_index: int, new_ids: list[int]):
        self.ids.extend(new_ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        click.echo(text[self.printed:], nl=False)
        self.printed = len(text)


def load_decoder(target, draft, device, cuda_graphs=True, device_rounds=True):
    from specsample_cupy.decoder import SpeculativeDecoder

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # the device choice was reported already
            return SpeculativeDecoder(target, draft, device=device, cuda_graphs=cuda_graphs,
                                      device_rounds=device_rounds)
    except (ValueError, RuntimeError) as e:
        raise click.ClickException(str(e)) from e


@click.command()
@click.option("--target", type=click.Path(exists=True, file_okay=False), default=None,
              help="Target model directory (default: the embedded stdlib-code target).")
@click.option("--draft", type=click.Path(exists=True, file_okay=False), default=None,
              help="Draft model directory (default: the embedded stdlib-code draft).")
@click.option("--prompt", "prompts", multiple=True, required=True, help="Prompt text; repeat for a batch.")
@click.option("--max-new-tokens", default=64, show_default=True, type=click.IntRange(min=0))
@click.option("--gamma", default=5, show_default=True, type=click.IntRange(min=0),
              help="Draft tokens per round; 0 decodes with the target alone.")
@click.option("--method", type=click.Choice(METHODS), default="exact", show_default=True)
@click.option("--temperature", default=1.0, show_default=True, type=click.FloatRange(min=0))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default=None,
              help="Default: cuda when usable, else cpu.")
@click.option("--adaptive-gamma", is_flag=True, help="Adapt gamma per round (+2 after a fully accepted round, -1 otherwise).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with texts, token_ids and stats.")
def decode(target, draft, prompts, max_new_tokens, gamma, method, temperature, seed, device, adaptive_gamma,
           as_json):
    """Generate text by speculative decoding (the draft proposes, the target verifies)."""
    decoder = load_decoder(target, draft, resolve_device(device))
    stream = None
    if len(prompts) == 1 and not as_json:
        click.echo(prompts[0], nl=False)
        stream = TextStream(decoder.tokenizer)
    try:
        out = decoder.generate(list(prompts), max_new_tokens=max_new_tokens, gamma=gamma, method=method,
                               temperature=temperature, seed=seed, adaptive_gamma=adaptive_gamma,
                               on_tokens=stream)
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    if as_json:
        click.echo(json.dumps({"texts": out.texts, "token_ids": out.token_ids, "stats": out.stats}))
        return
    if stream is not None:
        click.echo()
    else:
        for i, (prompt, text) in enumerate(zip(prompts, out.texts)):
            click.echo(f"--- [{i}] ---\n{prompt}{text}")
    click.echo()
    click.echo(stats_table(out.stats))
