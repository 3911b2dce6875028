"""`specsample eval`: task-level evaluation (ASR word error rate, summarization ROUGE).

Each command runs every requested verification method over the same data and
prints the paper's table: accuracy, mean accepted tokens per round, acceptance
rate, verification time per step and in total, end-to-end time, and the
relative change against `baseline`.

--draft ngram drafts by prompt lookup over each item's own tokens instead of a draft model (as
`specsample decode --draft ngram`); its drafts are one-hot, so only exact, greedy and target apply.
"""
import click

from specsample_cupy.cli.decode import DraftOption
from specsample_cupy.cli.paths import check_plot, check_writable, os_error
from specsample_cupy.decode.ngram import NGRAM, check_ngram_range
from specsample_cupy.tasks.evaluation import ALL_METHODS, DEFAULT_METHODS, NGRAM_METHODS


def _common(func):
    """Options both tasks take."""
    options = [
        click.option("--target", required=True, type=click.Path(exists=True, file_okay=False),
                     help="Target model folder (ONNX export)."),
        click.option("--draft", required=True, type=DraftOption(),
                     help="Draft model folder (ONNX export, same tokenizer), or 'ngram': drafts by prompt "
                          "lookup (what followed the last --ngram-max..--ngram-min tokens' most recent "
                          "earlier occurrence), no draft model."),
        click.option("--ngram-min", default=1, show_default=True, type=click.IntRange(min=1),
                     help="Shortest suffix prompt lookup matches (--draft ngram)."),
        click.option("--ngram-max", default=4, show_default=True, type=click.IntRange(min=1),
                     help="Longest suffix prompt lookup matches (--draft ngram)."),
        click.option("--methods", default=None,
                     help=f"Comma-separated, from: {', '.join(ALL_METHODS)} "
                          "('target' decodes with the target alone). Default: "
                          f"{','.join(DEFAULT_METHODS)}; with --draft ngram {','.join(NGRAM_METHODS)} "
                          "(the only ones it takes)."),
        click.option("--gamma", default=5, show_default=True, type=int,
                     help="Draft tokens proposed per verification step."),
        click.option("--limit", default=None, type=click.IntRange(min=1),
                     help="Evaluate at most N usable items (bad ones do not count)."),
        click.option("--temperature", default=1.0, show_default=True, type=float,
                     help="Sampling temperature of both models (method 'greedy' uses 0)."),
        click.option("--seed", default=0, show_default=True, type=int),
        click.option("--device", type=click.Choice(["cuda", "cpu"]), default=None,
                     help="Default: cuda when CuPy and onnxruntime-gpu can use a GPU, else cpu."),
        click.option("--json", "json_path", type=click.Path(dir_okay=False),
                     help="Write every per-item and per-step number here."),
        click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
                     help="PNG of the verification time per step, by method."),
        click.option("--warmup/--no-warmup", default=True, show_default=True,
                     help="Run each method once, untimed, before measuring."),
        click.option("--progress/--no-progress", default=True, show_default=True),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _settings(methods, gamma, temperature, seed, max_new_tokens, warmup, progress, draft, ngram_min, ngram_max,
              json_path=None, plot_path=None):
    """RunSettings from the options; every option problem is a usage error, and an output path that
    cannot be written an error, before any model loads."""
    from specsample_cupy.tasks.evaluation import RunSettings, check_ngram_methods, parse_methods

    check_writable(json_path, "--json", make_parents=True)   # tasks/report.py creates missing folders
    check_plot(plot_path, make_parents=True)
    try:   # checked whatever --draft is, as `specsample decode` does
        check_ngram_range(ngram_min, ngram_max)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--ngram-min/--ngram-max")
    ngram = draft == NGRAM
    if methods is None:
        methods = ",".join(NGRAM_METHODS if ngram else DEFAULT_METHODS)
    try:
        settings = RunSettings(parse_methods(methods), gamma=gamma, max_new_tokens=max_new_tokens,
                               temperature=temperature, seed=seed, warmup=warmup, progress=progress)
        settings.check()
        if ngram:
            check_ngram_methods(settings.methods)
    except ValueError as exc:
        raise click.UsageError(str(exc))
    return settings


def _run(fn, *args, **kwargs):
    """Turn data/model problems into a clean CLI error instead of a traceback. When no item was usable
    the run fails (exit 1) after listing why each was skipped, on stderr: no table of zeros."""
    from specsample_cupy.tasks.datasets import NoUsableItems

    try:
        fn(*args, echo=click.echo, **kwargs)
    except NoUsableItems as exc:
        for s in exc.skipped:
            click.echo(f"skipped {s}", err=True)
        raise click.ClickException(str(exc)) from exc
    except (ValueError, RuntimeError) as exc:   # DataError is a ValueError
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:   # a report that could not be written after all (a full disk, say)
        raise os_error(exc) from exc


@click.group(name="eval", context_settings={"help_option_names": ["-h", "--help"]})
def eval_group():
    """Accuracy and verification time of baseline / exact / sigmoid verification on real tasks."""


@eval_group.command("asr")
@_common
@click.option("--data", required=True, type=click.Path(exists=True),
              help="Folder with LibriSpeech-style *.trans.txt transcripts, or a JSONL manifest "
                   '{"audio": path, "text": reference}.')
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--language", default="en", show_default=True, help="Language token for multilingual models.")
@click.option("--task", "asr_task", type=click.Choice(["transcribe", "translate"]), default="transcribe",
              show_default=True)
def asr(target, draft, ngram_min, ngram_max, methods, gamma, limit, temperature, seed, device, json_path,
        plot_path, warmup, progress, data, max_new_tokens, language, asr_task):
    """Speech recognition with a Whisper draft/target pair (optimum ONNX exports), scored by WER."""
    from specsample_cupy.tasks.asr import run_asr

    settings = _settings(methods, gamma, temperature, seed, max_new_tokens, warmup, progress, draft,
                         ngram_min, ngram_max, json_path, plot_path)
    _run(run_asr, target, draft, data, settings, device=device, limit=limit, language=language,
         task=asr_task, json_path=json_path, plot_path=plot_path, ngram_min=ngram_min, ngram_max=ngram_max)


@eval_group.command("summarize")
@_common
@click.option("--data", required=True, type=click.Path(exists=True, dir_okay=False),
              help='JSONL file of {"article": ..., "summary": ...} (summary optional).')
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--template", default="{article}\\nSummary:", show_default=True,
              help="Prompt template; {article} marks the article, \\n a newline.")
def summarize(target, draft, ngram_min, ngram_max, methods, gamma, limit, temperature, seed, device, json_path,
              plot_path, warmup, progress, data, max_new_tokens, template):
    """Summarization with a decoder-only draft/target pair (optimum ONNX exports), scored by ROUGE."""
    from specsample_cupy.tasks.summarize import run_summarize

    settings = _settings(methods, gamma, temperature, seed, max_new_tokens, warmup, progress, draft,
                         ngram_min, ngram_max, json_path, plot_path)
    _run(run_summarize, target, draft, data, settings, device=device, limit=limit, template=template,
         json_path=json_path, plot_path=plot_path, ngram_min=ngram_min, ngram_max=ngram_max)
