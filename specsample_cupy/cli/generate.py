"""`specsample generate`: decode every request of a dataset file into a JSONL file, resumably.

Each request's line is appended (and flushed) as the request finishes and the file is fsync'ed after
every --batch-size lines, so an interrupted run loses at most the requests still being decoded; running
the same command again skips the ids the output already holds and cuts away a torn last line. Bad input
lines (malformed, duplicate or missing ids, prompts too long for the context) are reported on stderr and
skipped. Requests are decoded with continuous batching (batch/runner.py's Runner.run_stream), or with
--static (and where continuous batching cannot run: --gamma auto, --adaptive-gamma, method baseline)
in generate() calls by batch/runner.py's batching rule. With --ray, cli/generate_ray.py hands the requests to
a pool of Ray workers, which batch them the same way, and this process writes their lines.

Every line records the run's settings (batch/run_settings.py); a resume with other settings is refused
before any model loads, unless --force-settings. The output path is checked before anything else.
"""
from __future__ import annotations

import os
import time

import click

from specsample_cupy.batch.common import check_generated, fitting, interrupted, open_output, pending_of, summary_counts
from specsample_cupy.batch.inputs import Settings, read_requests
from specsample_cupy.batch.prompt_lines import FORMATS
from specsample_cupy.batch.outputs import Recovered, scan_file
from specsample_cupy.batch.ray_worker import WorkerSetup
from specsample_cupy.batch.run_settings import SettingsMismatch, check_resume, recorded_base_seed, run_settings
from specsample_cupy.batch.runner import DecodeOptions, Runner, batches, continuous_allowed
from specsample_cupy.cli.decode import CONTEXT_SETTINGS, decode, load_decoder, read_input, resolve_device
from specsample_cupy.cli.options import GammaType, sampling_settings
from specsample_cupy.cli.paths import check_writable
from specsample_cupy.verification.seeds import random_base_seed

LOGPROB_METHODS = ("exact", "greedy", "target")   # what generate(logprobs=True) takes

# `specsample decode`'s options that mean the same here (their click.Option objects, shared).
DECODE_OPTIONS = ("target", "draft", "ngram_min", "ngram_max", "device", "method", "max_new_tokens", "stop_strings",
                  "top_k", "top_p", "min_p", "temperature", "seed", "adaptive_gamma")


def _with_decode_options(command: click.Command) -> click.Command:
    """Give the command DECODE_OPTIONS, after its own first two (--input, --output) in its help."""
    by_name = {p.name: p for p in decode.params}
    command.params[2:2] = [by_name[name] for name in DECODE_OPTIONS]
    return command


def _check_paths(input_path: str, output_path: str):
    if input_path != "-" and os.path.exists(output_path) and os.path.exists(input_path) \
            and os.path.samefile(input_path, output_path):
        raise click.UsageError("--output must not be the --input file")
    check_writable(output_path, "--output")


def _recovered(path: str) -> Recovered:
    try:
        return scan_file(path)
    except OSError as exc:
        raise click.ClickException(f"{path}: cannot read it ({exc.strerror or exc})") from exc


def base_seed(seed: int | None, recovered: Recovered, path: str) -> tuple[int, str]:
    """(the run's base seed, where it came from: "option" or "random"). --seed random draws one from
    the operating system, or on a resume takes the one the file's lines record, so that re-running the
    same command resumes."""
    if seed is not None:
        return seed, "option"
    recorded = recorded_base_seed(recovered.settings)
    if recorded is not None:
        click.echo(f"--seed random: resuming {path} with the base seed its lines record, {recorded}", err=True)
        return recorded, "random"
    return random_base_seed(), "random"


def settings_of_run(recovered: Recovered, path: str, force: bool, **options) -> dict:
    """The run's settings (generate_settings.run_settings), refused when the file's lines were written
    with others (unless force), before any model loads."""
    try:
        settings = run_settings(**options)
        check_resume(recovered.settings, settings, path, force)
    except SettingsMismatch as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:
        raise click.ClickException(f"cannot read the model files ({exc.filename}: {exc.strerror or exc})") from exc
    return settings


def _summary(runner, read_as: str, already_done: int, rejected: int, wall_s: float, load_s: float) -> str:
    after_load = max(wall_s - load_s, 1e-9)
    outside = max(after_load - runner.decoding_s, 0.0) / after_load
    return "\n".join(summary_counts(runner, read_as, already_done, rejected, after_load) + [
        f"wall: {wall_s:.2f} s, loading the models {load_s:.2f} s; outside generate() calls (reading, checking, "
        f"writing, bookkeeping): {outside:.1%} of the rest",
    ])


@_with_decode_options
@click.command(context_settings=CONTEXT_SETTINGS)
@click.option("--input", "input_path", required=True, type=click.Path(dir_okay=False, allow_dash=True),
              help="Requests: JSONL ({\"id\", \"prompt\"}, optional \"max_new_tokens\", \"temperature\", \"seed\" "
                   "per line) or one prompt per line (id: the line number). '-' reads stdin.")
@click.option("--output", "output_path", required=True, type=click.Path(dir_okay=False),
              help="JSONL results, one line per request as it finishes; ids already in it are skipped (resume).")
@click.option("--input-format", type=click.Choice(FORMATS), default="auto", show_default=True,
              help="auto: JSONL for a *.jsonl name or when most non-blank lines are JSON objects, else text.")
@click.option("--batch-size", default=8, show_default=True, type=click.IntRange(min=1),
              help="Requests decoded at once: the rows of continuous batching, or with --static the most "
                   "requests per generate() call (a call takes only requests of equal settings).")
@click.option("--static", "static", is_flag=True,
              help="Static batching: a batch waits for its slowest request before the next starts. Default: "
                   "continuous batching, a finished request's row takes the next request at once (each request "
                   "gets the tokens it gets decoded alone).")
@click.option("--gamma", default="5", show_default=True, type=GammaType(),
              help="Draft tokens per round, 0 for the target alone, or 'auto'.")
@click.option("--logprobs", is_flag=True,
              help="Each line also holds \"logprobs\": each generated token's log-probability under the "
                   "(truncated) target distribution it was drawn from (methods exact, greedy, target).")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar on stderr.")
@click.option("--ray", "on_ray", is_flag=True,
              help="Decode on a pool of Ray workers (actors) instead of in this process: pip install -e '.[ray]'.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="With --ray: workers, each with its own copy of the models.  [default: 1]")
@click.option("--gpus-per-worker", type=click.FloatRange(min=0), default=None,
              help="With --ray: GPUs each worker takes (a fraction shares a GPU); 0 makes CPU workers of one CPU "
                   "each.  [default: 0 with --device cpu, else 1]")
@click.option("--ray-address", default=None,
              help="With --ray: join this Ray cluster ('auto': the one `ray start` runs on this machine) instead "
                   "of starting a local Ray sized for the workers.")
@click.option("--strict", is_flag=True,
              help="Exit with status 1 when any request was not generated (a rejected line, a prompt the models "
                   "cannot take, a refused batch), not only when none was.")
@click.option("--force-settings", is_flag=True,
              help="Resume even though the output's lines were written with other settings (the lines then "
                   "mix them; each records its own).")
def generate(input_path, output_path, target, draft, ngram_min, ngram_max, device, method, max_new_tokens,
             stop_strings, top_k, top_p, min_p, temperature, seed, adaptive_gamma, input_format, batch_size, static,
             gamma, logprobs, progress, on_ray, workers, gpus_per_worker, ray_address, strict, force_settings):
    """Decode a dataset of requests into a JSONL file, resumably.

    Each line of --output is one request: id, line, text, token_ids, finish_reason, new_tokens, its
    own rounds / proposed / accepted / acceptance_rate, latency_s, batch_size, its max_new_tokens,
    temperature, seed and seed_from (a JSONL line's "max_new_tokens", "temperature" and "seed" override
    the options; a request without its own seed gets one derived from --seed and its id), and
    "settings": the run's method, gamma, truncation, stop strings, seed and models (with a fingerprint);
    with --logprobs also logprobs, one per token_ids entry.
    Re-running with the same --output decodes only the ids it does not hold yet; other settings than the
    file's are refused unless --force-settings. Bad input lines are reported on stderr (FILE:LINE: why)
    and skipped; the exit status is 1 only when nothing could be decoded (with --strict: when anything
    could not). Requests are batched continuously unless --static is given or the options need static
    batching (--gamma auto, --adaptive-gamma, --method baseline; a note says so). With --ray, Ray
    workers decode the requests, batched the same way, and this process writes their lines.
    """
    from specsample_cupy.cli.generate_ray import generate_on_ray, ray_pool   # it imports this module

    started = time.perf_counter()
    sampling = sampling_settings(method=method, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                 seed=seed, gamma=gamma, adaptive_gamma=adaptive_gamma, stop=stop_strings,
                                 max_new_tokens=max_new_tokens, logprobs=logprobs)
    if logprobs and method not in LOGPROB_METHODS:
        raise click.BadParameter(f"--logprobs works with methods {', '.join(LOGPROB_METHODS)}, not {method!r}",
                                 param_hint="--method")
    _check_paths(input_path, output_path)
    pool = ray_pool(on_ray, workers, gpus_per_worker, ray_address, device)   # None without --ray
    name = "stdin" if input_path == "-" else input_path
    recovered = _recovered(output_path)
    seed, seed_origin = base_seed(seed, recovered, output_path)
    sampling = sampling.replace(seed=seed)   # the run's base seed, given or drawn
    settings = settings_of_run(recovered, output_path, force_settings, sampling=sampling, seed_origin=seed_origin,
                               target=target, draft=draft, ngram_min=ngram_min, ngram_max=ngram_max)
    options = DecodeOptions(method, gamma, adaptive_gamma, sampling.stop, sampling.truncation(), logprobs, settings)
    requests, rejections, read_as = read_requests(read_input(input_path), name, input_format,
                                                  Settings(max_new_tokens, sampling.temperature, seed), method)
    for r in rejections:
        click.echo(f"{name}:{r.line}: {r.reason}; skipped", err=True)
    if not requests:
        raise click.ClickException(f"{name}: no usable request ({len(rejections)} line(s) rejected)")
    if seed_origin == "random":
        click.echo(f"--seed random: base seed {seed} (every line records it)", err=True)
    try:
        if pool is not None:
            setup = WorkerSetup(name, target, draft, pool.device, ngram_min, ngram_max, options)
            generate_on_ray(requests, len(rejections), read_as, output_path, setup, pool, batch_size, progress,
                            static, strict)
            return
        _decode_here(requests, rejections, read_as, name, output_path, options, started, strict, static=static,
                     batch_size=batch_size, progress=progress, target=target, draft=draft, device=device,
                     ngram_min=ngram_min, ngram_max=ngram_max)
    except KeyboardInterrupt:
        interrupted(output_path)


def _decode_here(requests, rejections, read_as, name, output_path, options, started, strict, *, static, batch_size,
                 progress, target, draft, device, ngram_min, ngram_max):
    """The single-process run: load the pair, open the output, decode the requests it does not hold."""
    loading = time.perf_counter()
    decoder = load_decoder(target, draft, resolve_device(device), ngram_min=ngram_min, ngram_max=ngram_max,
                           batch_layout=batch_size > 1)
    load_s = time.perf_counter() - loading
    writer = open_output(output_path)
    try:
        pending, already_done = pending_of(requests, writer)
        todo, refused = fitting(decoder, pending, name)
        for _, why in refused:
            click.echo(f"{why}; skipped", err=True)
        rejected = len(rejections) + len(pending) - len(todo)
        runner = Runner(decoder, writer, options, len(todo), progress)
        why_static = "--static" if static else continuous_allowed(options.gamma, options.adaptive_gamma,
                                                                  options.method)
        if why_static and not static:
            click.echo(f"batching statically: {why_static}", err=True)
        source = lambda r: f"{name}:{r.line}"
        try:
            if why_static:
                for batch in batches(todo, batch_size):
                    runner.run(batch, source)
            elif todo:
                runner.run_stream(todo, batch_size, source)
        finally:
            runner.close()
    finally:
        writer.close()
    click.echo(_summary(runner, read_as, already_done, rejected, time.perf_counter() - started, load_s), err=True)
    check_generated(runner.written, len(todo), already_done, rejected + runner.failed, strict)
