"""`specsample decode`: generate text with speculative decoding.

Everything that can be checked is checked before the first byte reaches stdout (options, prompts, the
models, each prompt against the context), so a failed run prints only `Error: ...` on stderr. stdout
then holds the generated text alone (text mode), one JSON object (--json) or one JSON line per request
(--jsonl); the statistics table and warnings go to stderr.
"""
from __future__ import annotations

import json
import sys
import warnings
from dataclasses import dataclass

import click

from specsample_cupy.batch.prompt_lines import input_lines, is_jsonl, json_object
from specsample_cupy.cli.options import GammaType, SeedType, sampling_settings
from specsample_cupy.decode.call_args import METHODS
from specsample_cupy.decode.ngram import NGRAM
from specsample_cupy.decode.stop_strings import cut_text
from specsample_cupy.verification.api import ONEHOT_METHODS

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}
MAX_LISTED_ERRORS = 10
STATS_SHOWN = (
    ("method", "{}"), ("device", "{}"), ("seed", "{}"), ("gamma", "{}"), ("rounds", "{}"), ("generated_tokens", "{}"),
    ("acceptance_rate", "{:.3f}"), ("mean_accepted_per_round", "{:.2f}"), ("tokens_per_s", "{:.1f}"),
    ("verify_time_per_round_s", "{:.6f}"), ("model_time_s", "{:.4f}"),
    ("host_overhead_per_round_s", "{:.6f}"), ("wall_s", "{:.4f}"),
)


def stats_table(stats: dict) -> str:
    """The decode statistics as a two-column text table (None, e.g. an untimed figure, shows as -)."""
    rows = [(key, "-" if stats[key] is None else fmt.format(stats[key]))
            for key, fmt in STATS_SHOWN if key in stats]
    width = max(len(k) for k, _ in rows)
    values = max(12, *(len(v) for _, v in rows))   # a 63-bit seed is 19 digits
    return "\n".join(f"{k:<{width}}  {v:>{values}}" for k, v in rows)


def resolve_device(device: str | None) -> str:
    """The requested device, or "cuda" when usable and otherwise "cpu" (said on stderr, with the reason)."""
    from specsample_cupy.runtime.ort_session import cuda_status

    if device is None:
        usable, why_not = cuda_status()
        if usable:
            return "cuda"
        click.echo(f"No usable CUDA device ({why_not}); running on the CPU.", err=True)
        return "cpu"
    return device


class DraftOption(click.ParamType):
    """--draft: a draft model directory, or "ngram" (prompt lookup, no draft model)."""
    name = "DIR|ngram"

    def convert(self, value, param, ctx):
        if value == NGRAM:
            return value
        return click.Path(exists=True, file_okay=False).convert(value, param, ctx)


DRAFT_HELP = ("Draft model directory (default: the embedded stdlib-code draft), or 'ngram': drafts by prompt "
              "lookup (what followed the last --ngram-max..--ngram-min tokens' most recent earlier occurrence), "
              "verified exactly; methods exact and greedy.")


def draft_options(f):
    """--draft (a directory or 'ngram') with --ngram-min / --ngram-max, for every command that loads a pair."""
    f = click.option("--ngram-max", default=4, show_default=True, type=click.IntRange(min=1),
                     help="Longest suffix prompt lookup matches (--draft ngram).")(f)
    f = click.option("--ngram-min", default=1, show_default=True, type=click.IntRange(min=1),
                     help="Shortest suffix prompt lookup matches (--draft ngram).")(f)
    return click.option("--draft", type=DraftOption(), default=None, help=DRAFT_HELP)(f)


def load_decoder(target, draft, device, cuda_graphs=True, device_rounds=True, ngram_min=1, ngram_max=4,
                 cpu_threads=None, batch_layout=False):
    """SpeculativeDecoder, with a model problem (unusable file, mismatched pair) as a click error.
    batch_layout: for runs that batch (SpeculativeDecoder's argument)."""
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    from specsample_cupy.decode.decoder_device import CPU_FALLBACK_WARNING

    try:
        with warnings.catch_warnings():   # the device choice was reported already; other warnings show
            warnings.filterwarnings("ignore", message=CPU_FALLBACK_WARNING, category=RuntimeWarning)
            return SpeculativeDecoder(target, draft, device=device, cuda_graphs=cuda_graphs,
                                      device_rounds=device_rounds, ngram_min=ngram_min, ngram_max=ngram_max,
                                      cpu_threads=cpu_threads, batch_layout=batch_layout)
    except (ValueError, RuntimeError) as e:
        raise click.ClickException(str(e)) from e


# --------------------------------------------------------------------------- prompts

@dataclass
class Prompt:
    text: str
    source: str   # where it came from, for messages and --jsonl: "--prompt 2", "stdin", "FILE:LINE"


def _error_list(title: str, errors: list[str]) -> str:
    shown = errors[:MAX_LISTED_ERRORS]
    more = len(errors) - len(shown)
    return "\n".join([title] + [f"  {e}" for e in shown] + ([f"  ... and {more} more"] if more else []))


def parse_prompt_file(data: bytes, name: str) -> list[Prompt]:
    """Prompts from a file's bytes: one per non-blank line, or JSONL ({"prompt": ...} per line), read
    by the rules `generate --input` reads by (batch/prompt_lines.py: a *.jsonl name, or most lines JSON
    objects). Problems are reported all at once, one line per bad line of the file."""
    lines, undecodable = input_lines(data)
    if not lines and not undecodable:
        raise click.ClickException(f"{name} holds no prompts")
    objects = [json_object(line) for _, line in lines]
    jsonl = is_jsonl(objects, name)
    looks_json = [n for (n, _), o in zip(lines, objects) if o is not None]
    if not jsonl and looks_json:
        click.echo(f"warning: {name}: read as one prompt per line, though line(s) "
                   f"{', '.join(map(str, looks_json[:5]))} are JSON objects (name it *.jsonl to read JSONL)",
                   err=True)
    prompts, errors = [], list(undecodable)
    for (n, line), obj in zip(lines, objects):
        if not jsonl:
            prompts.append(Prompt(line, f"{name}:{n}"))
        elif obj is None:
            errors.append((n, "not a JSON object"))
        elif not isinstance(obj.get("prompt"), str):
            errors.append((n, 'no string "prompt" field'))
        else:
            prompts.append(Prompt(obj["prompt"], f"{name}:{n}"))
    if errors:
        errors = [f"{name}:{n}: {why}" for n, why in sorted(errors)]
        raise click.ClickException(_error_list(f"{name}: {len(errors)} bad line(s):", errors))
    return prompts


def read_input(path: str) -> bytes:
    """A file's bytes ('-': stdin's); a click error naming it when it cannot be read."""
    try:
        if path == "-":
            return click.get_binary_stream("stdin").read()
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise click.ClickException(f"{path}: cannot read it ({exc.strerror or exc})") from exc


def _read_text(path: str) -> str:
    """All of a file ('-': stdin) as UTF-8 text; a click error naming it when it cannot be read."""
    name = "stdin" if path == "-" else path
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as exc:
        raise click.ClickException(f"{name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except OSError as exc:
        raise click.ClickException(f"{name}: cannot read it ({exc.strerror or exc})") from exc


def read_prompts(texts: tuple[str, ...], prompt_file: str | None) -> list[Prompt]:
    """--prompt values ('-' reads all of stdin as one prompt, verbatim), then --prompt-file's prompts
    ('-' reads them from stdin; JSONL or text by batch/prompt_lines.py's rule)."""
    if texts.count("-") + (prompt_file == "-") > 1:
        raise click.UsageError("stdin can be read once: use '-' for one --prompt or for --prompt-file")
    prompts = [Prompt(_read_text("-"), "stdin") if t == "-" else Prompt(t, f"--prompt {i}")
               for i, t in enumerate(texts)]
    if prompt_file is not None:
        name = "stdin" if prompt_file == "-" else prompt_file
        prompts += parse_prompt_file(read_input(prompt_file), name)
    if not prompts:
        raise click.UsageError("no prompt given: use --prompt TEXT, --prompt - (stdin) or --prompt-file FILE")
    return prompts


def encode_all(decoder, prompts: list[Prompt]) -> list[list[int]]:
    """Each prompt's token ids; every prompt the models cannot take (too long for the context, empty
    without a start token, ...) is reported by its source before anything is generated."""
    ids, errors = [], []
    for p in prompts:
        try:
            ids.append(decoder.encode_prompts([p.text])[0])
        except ValueError as exc:
            message = str(exc)   # the decoder numbers prompts within the call: "prompt 0 has ..."
            if message.startswith("prompt 0 "):
                message = "the prompt " + message.removeprefix("prompt 0 ")
            errors.append(f"{p.source}: {message}")
    if errors:
        raise click.ClickException(_error_list(f"{len(errors)} prompt(s) cannot be decoded:", errors)
                                   if len(errors) > 1 else errors[0])
    return ids


# --------------------------------------------------------------------------- finishing requests

class TextStream:
    """Prints one request's text as its tokens arrive (after `prefix`, the prompt with --echo); holds
    back an incomplete UTF-8 character, and with stop strings never prints one (nor the characters that
    could begin one). finish() prints whatever the stream has not."""

    def __init__(self, tokenizer, prefix: str = "", stops=()):
        self.tokenizer, self.ids, self.printed, self.prefix = tokenizer, [], 0, prefix
        self.stops = tuple(stops)
        self.holdback = max((len(s) for s in self.stops), default=1) - 1

    def _write(self, text: str):
        if self.prefix:
            click.echo(self.prefix, nl=False)
            self.prefix = ""
        click.echo(text, nl=False)

    def __call__(self, request_index: int, new_ids: list[int]):
        self.ids.extend(new_ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        cut, stopped = cut_text(text, self.stops)
        upto = len(cut) if stopped else len(text) - self.holdback
        if upto > self.printed:
            self._write(text[self.printed:upto])
            self.printed = upto

    def finish(self, final_text: str):
        self._write(final_text[self.printed:] + "\n")


class JsonlStream:
    """Writes one JSON line per request as soon as the decoder finishes it ({"index", "source", "text",
    "token_ids", "finish_reason"}, flushed), so a consumer can act on early finishers of a long batch;
    lines come in finish order and `index` says which prompt. The decoder says which requests a round
    finished and why (generate()'s on_round: the request state's finished and finish_reason());
    finish() writes the requests not yet written."""

    def __init__(self, tokenizer, prompts: list[Prompt], stops=(), early=True):
        """early=False: every line at finish() (log-probabilities are known only then)."""
        self.tokenizer, self.prompts, self.stops = tokenizer, prompts, tuple(stops)
        self.early = early
        self.ids = [[] for _ in prompts]
        self.written = [False] * len(prompts)

    def _write(self, b: int, text: str, ids: list[int], reason: str, logprobs=None):
        line = {"index": b, "source": self.prompts[b].source, "text": text, "token_ids": ids,
                "finish_reason": reason}
        if logprobs is not None:
            line["logprobs"] = logprobs
        click.echo(json.dumps(line, ensure_ascii=False))
        self.written[b] = True

    def __call__(self, b: int, new_ids: list[int]):
        """generate()'s on_tokens."""
        self.ids[b].extend(new_ids)

    def on_round(self, rnd, requests):
        """generate()'s on_round: the lines of the requests the decoder has finished."""
        if not self.early:
            return
        for b, finished in enumerate(requests.finished.tolist()):
            if not finished or self.written[b]:
                continue
            reason = requests.finish_reason(b)
            text = self.tokenizer.decode(self.ids[b], skip_special_tokens=True)
            if reason == "stop" or cut_text(text, self.stops)[1]:
                continue   # a stop string ended it: finish() writes the cut text and ids
            self._write(b, text, self.ids[b], reason)

    def finish(self, out, reasons: list[str]):
        for b, written in enumerate(self.written):
            if not written:
                self._write(b, out.texts[b], out.token_ids[b], reasons[b],
                            None if out.logprobs is None else out.logprobs[b])


def warn_context_stops(prompts: list[Prompt], out, context: int | None, max_new_tokens: int):
    for p, ids, reason in zip(prompts, out.token_ids, out.finish_reasons):
        if reason == "context":
            click.echo(f"warning: {p.source}: stopped at the end of the models' context ({context} "
                       f"tokens) after {len(ids)} of --max-new-tokens {max_new_tokens}", err=True)


# --------------------------------------------------------------------------- the command

@click.command(context_settings=CONTEXT_SETTINGS)
@click.option("--target", type=click.Path(exists=True, file_okay=False), default=None,
              help="Target model directory (default: the embedded stdlib-code target).")
@draft_options
@click.option("--prompt", "prompt_texts", multiple=True,
              help="Prompt text; repeat for a batch. '-' reads all of stdin as one prompt, verbatim.")
@click.option("--prompt-file", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="More prompts: one per non-blank line, or JSONL ({\"prompt\": ...} per line; *.jsonl, or "
                   "most lines JSON objects, as generate reads --input). '-' reads stdin.")
@click.option("--max-new-tokens", default=64, show_default=True, type=click.IntRange(min=0),
              help="Tokens to generate per prompt at most (fewer after an EOS or at the end of the context).")
@click.option("--gamma", default="5", show_default=True, type=GammaType(),
              help="Draft tokens per round; 0 decodes with the target alone; 'auto' picks each round's from the "
                   "measured acceptance and costs.")
@click.option("--method", type=click.Choice(METHODS), default="exact", show_default=True)
@click.option("--temperature", default=None, type=click.FloatRange(min=0),
              help="Sampling temperature of both models; 0 is greedy.  [default: 1; --method greedy: 0, the only "
                   "value it takes]")
@click.option("--seed", default="0", show_default=True, type=SeedType(),
              help="Base seed: each request draws from its own random stream, derived from it and the request's "
                   "index (an id's, in generate); 'random' draws one from the operating system (reported).")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default=None,
              help="Default: cuda when usable, else cpu.")
@click.option("--adaptive-gamma", is_flag=True,
              help="Adapt gamma per round (+2 after a fully accepted round, -1 otherwise).")
@click.option("--stop", "stop_strings", multiple=True,
              help="Stop string; repeat for more. A request whose text contains one ends there (finish reason "
                   "\"stop\"; the text is cut before it).")
@click.option("--top-k", type=click.IntRange(min=0), default=None,
              help="Truncated sampling of both models: keep the k most likely tokens (ties kept; 0 = off).")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=None,
              help="Keep the most likely tokens whose mass reaches P (within the top-k set; 1 = off).")
@click.option("--min-p", type=click.FloatRange(0, 1), default=None,
              help="Keep tokens with probability >= P x the most likely one's (0 = off).")
@click.option("--logprobs", is_flag=True,
              help="--json / --jsonl: each generated token's log-probability under the (truncated) target "
                   "distribution it was drawn from.")
@click.option("--echo", is_flag=True, help="Text mode: print each prompt before its generated text.")
@click.option("--stats/--no-stats", default=True, show_default=True,
              help="Text and --jsonl modes: print the statistics table on stderr (--json includes them).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: texts, token_ids, finish_reasons and stats.")
@click.option("--jsonl", "as_jsonl", is_flag=True,
              help="Print one JSON line per request as it finishes: index, source, text, token_ids, finish_reason.")
def decode(target, draft, ngram_min, ngram_max, prompt_texts, prompt_file, max_new_tokens, gamma, method,
           temperature, seed, device, adaptive_gamma, stop_strings, top_k, top_p, min_p, logprobs, echo, stats,
           as_json, as_jsonl):
    """Generate text by speculative decoding (the draft proposes, the target verifies).

    stdout holds the generated text (a batch: each text under a `--- [i] ---` line, with
    FILE:LINE for prompts from --prompt-file), or the JSON;
    statistics and warnings go to stderr. A finish reason is "eos", "length" (--max-new-tokens),
    "stop" (a --stop string) or "context" (the models' context ended first, also warned about on stderr).
    """
    if as_json and as_jsonl:
        raise click.UsageError("--json and --jsonl are exclusive")
    if logprobs and not (as_json or as_jsonl):
        raise click.UsageError("--logprobs prints with --json or --jsonl")
    settings = sampling_settings(method=method, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                 seed=seed, gamma=gamma, adaptive_gamma=adaptive_gamma, stop=stop_strings,
                                 max_new_tokens=max_new_tokens, logprobs=logprobs)
    prompts = read_prompts(prompt_texts, prompt_file)
    if ngram_min > ngram_max:
        raise click.BadParameter(f"--ngram-min {ngram_min} > --ngram-max {ngram_max}", param_hint="--ngram-min")
    if draft == NGRAM and method not in ONEHOT_METHODS:
        raise click.BadParameter(f"--draft ngram verifies one-hot drafts: use --method {' or '.join(ONEHOT_METHODS)}",
                                 param_hint="--method")
    decoder = load_decoder(target, draft, resolve_device(device), ngram_min=ngram_min, ngram_max=ngram_max,
                           batch_layout=len(prompts) > 1)
    encode_all(decoder, prompts)   # every prompt checked before anything is generated
    stream = on_round = None
    if as_jsonl:
        stream = JsonlStream(decoder.tokenizer, prompts, stop_strings, early=not logprobs)
        on_round = stream.on_round
    elif len(prompts) == 1 and not as_json:
        stream = TextStream(decoder.tokenizer, prompts[0].text if echo else "", stop_strings)
    try:
        out = decoder.generate([p.text for p in prompts], on_tokens=stream, on_round=on_round,
                               **settings.generate_kwargs())
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    reasons = out.finish_reasons
    if as_json:
        result = {"texts": out.texts, "token_ids": out.token_ids, "finish_reasons": reasons, "stats": out.stats}
        if logprobs:
            result["logprobs"] = out.logprobs
        click.echo(json.dumps(result, ensure_ascii=False))
    elif as_jsonl:
        stream.finish(out, reasons)
    elif stream is not None:
        stream.finish(out.texts[0])
    else:
        for i, (p, text) in enumerate(zip(prompts, out.texts)):
            where = "" if p.source.startswith("--prompt") else f" {p.source}"
            click.echo(f"--- [{i}]{where} ---\n{p.text if echo else ''}{text}")
    warn_context_stops(prompts, out, decoder.context_length, max_new_tokens)
    if stats and not as_json:
        click.echo(stats_table(out.stats), err=True)
