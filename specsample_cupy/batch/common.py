"""What `specsample generate` shares between decoding in this process (cli/generate.py) and on Ray
(cli/generate_ray.py, batch/ray_worker.py): the output file, the requests still to do, the prompts the
models can take, the summary and the exit status."""
from __future__ import annotations

import click

from specsample_cupy.batch.outputs import OutputBusy, ResultWriter
from specsample_cupy.cli.decode import Prompt, encode_all


def open_output(path: str) -> ResultWriter:
    try:
        writer = ResultWriter(path)
    except OutputBusy as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:
        raise click.ClickException(f"{path}: cannot write it ({exc.strerror or exc})") from exc
    found = writer.recovered
    if found.torn_bytes:
        click.echo(f"{path}: cut away a torn last line ({found.torn_bytes} bytes) left by an interrupted run; "
                   "its request runs again", err=True)
    for n in found.bad_lines:
        click.echo(f"{path}:{n}: not a JSON object with an \"id\"; left in place, counted as no request", err=True)
    return writer


def fitting(decoder, requests, name: str) -> tuple[list, list]:
    """The requests whose prompts the models can take, and (request, why) for each of the others."""
    kept, refused = [], []
    for request in requests:
        try:
            encode_all(decoder, [Prompt(request.prompt, f"{name}:{request.line}")])
        except click.ClickException as exc:   # "FILE:LINE: the prompt has N tokens; ..."
            refused.append((request, exc.message))
            continue
        kept.append(request)
    return kept, refused


def pending_of(requests, writer) -> tuple[list, int]:
    """The requests the output does not hold yet, and how many it does."""
    pending = [r for r in requests if r.key not in writer.recovered.done]
    return pending, len(requests) - len(pending)


def summary_counts(tally, read_as: str, already_done: int, rejected: int, decoding_s: float) -> list[str]:
    """The summary's lines on requests and tokens; tally: a Runner, or anything with its counts."""
    acceptance = f"{tally.accepted / tally.proposed:.3f}" if tally.proposed else "-"
    return [
        f"requests ({read_as} input): {tally.written} written, {already_done} skipped as already done, "
        f"{rejected} line(s) rejected, {tally.failed} failed",
        f"tokens: {tally.tokens} ({tally.tokens / max(decoding_s, 1e-9):.1f} tokens/s), acceptance {acceptance}",
    ]


def check_generated(written: int, todo: int, already_done: int, not_generated: int = 0, strict: bool = False):
    """The exit status is an error when nothing could be decoded, and with --strict when any request
    was not (a rejected input line, a prompt the models cannot take, a refused batch)."""
    if written == 0 and (todo or not already_done):
        raise click.ClickException("nothing was generated")
    if strict and not_generated:
        raise click.ClickException(f"--strict: {not_generated} request(s) not generated (reported above)")


def interrupted(output_path: str):
    """Ctrl-C: what was written is kept and a re-run resumes (exit status 130, as for SIGINT)."""
    click.echo(f"\nInterrupted: the lines written to {output_path} are kept; re-run the same command to resume.",
               err=True)
    raise click.exceptions.Exit(130)
