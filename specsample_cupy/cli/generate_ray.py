"""`specsample generate --ray`: the same requests and output file as the single-process run, decoded by a
pool of Ray actors (generate_ray) and their lines written by this process. Each worker batches as the
single-process run does: continuously over its shares of the requests, or statically (--static, and
the options continuous batching does not take), one batch of the same rule at a time.

The input is read, its bad lines reported and the output file recovered here, before Ray starts;
prompts too long for the context are found by the workers (this process loads no model) and reported
here, as the single-process run reports them.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import click

from specsample_cupy.batch.common import check_generated, open_output, pending_of, summary_counts
from specsample_cupy.batch.ray_worker import WorkerSetup
from specsample_cupy.batch.runner import batches, continuous_allowed


@dataclass
class RayPool:
    workers: int
    gpus_per_worker: float   # 0: CPU workers
    address: str | None      # None: a local Ray
    device: str              # what each worker decodes on


def ray_pool(on_ray: bool, workers, gpus_per_worker, address, device) -> RayPool | None:
    """The pool --ray and its options ask for (None without --ray), or a usage error."""
    if not on_ray:
        given = [f"--{name}" for name, value in (("workers", workers), ("gpus-per-worker", gpus_per_worker),
                                                 ("ray-address", address)) if value is not None]
        if given:
            raise click.UsageError(f"{', '.join(given)} only work with --ray")
        return None
    if gpus_per_worker is None:
        gpus_per_worker = 0.0 if device == "cpu" else 1.0
    if device == "cpu" and gpus_per_worker > 0:
        raise click.BadParameter("CPU workers take no GPU: use --gpus-per-worker 0", param_hint="--gpus-per-worker")
    if device == "cuda" and gpus_per_worker == 0:
        raise click.BadParameter("--device cuda needs a GPU for each worker: use --gpus-per-worker > 0",
                                 param_hint="--gpus-per-worker")
    return RayPool(workers or 1, gpus_per_worker, address, "cuda" if gpus_per_worker > 0 else "cpu")


def check_models(setup: WorkerSetup):
    """The pair's files and tokenizers, read here as every worker will read them, so that a wrong
    directory is one line of error before Ray starts rather than a failure in each worker."""
    from specsample_cupy.decode.decoder import default_model_dir
    from specsample_cupy.decode.ngram import NGRAM, check_ngram_range
    from specsample_cupy.runtime.model_folder import ModelSpec, check_pair

    try:
        target = ModelSpec.from_dir(setup.target or default_model_dir("target"))
        if setup.draft == NGRAM:
            check_ngram_range(setup.ngram_min, setup.ngram_max)
        else:
            check_pair(target, ModelSpec.from_dir(setup.draft or default_model_dir("draft")))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc


def generate_on_ray(requests, rejected: int, read_as: str, output_path: str, setup: WorkerSetup, pool: RayPool,
                    batch_size: int, progress: bool, static: bool, strict: bool = False):
    """Decode the requests the output does not hold yet on the pool; `rejected`: input lines already
    reported as bad; `static`: --static; `strict`: --strict."""
    try:
        import ray
        from specsample_cupy.batch import ray_driver as generate_ray
    except ImportError as exc:
        raise click.ClickException(f"--ray needs Ray Data: pip install -e '.[ray]' ({exc})") from exc
    check_models(setup)
    o = setup.options
    why_static = "--static" if static else continuous_allowed(o.gamma, o.adaptive_gamma, o.method)
    if why_static and not static:
        click.echo(f"batching statically: {why_static}", err=True)
    setup = dataclasses.replace(setup, batch_size=batch_size, static=bool(why_static))
    writer = open_output(output_path)
    started_ray, tally = False, generate_ray.Tally()
    try:
        pending, already_done = pending_of(requests, writer)
        if pending:
            started = time.perf_counter()
            started_ray = generate_ray.connect(pool.address, pool.workers)
            if started_ray and pool.address is None and pool.gpus_per_worker > 0:
                why = generate_ray.missing_gpus(pool.workers, pool.gpus_per_worker)
                if why:
                    raise click.ClickException(f"{why} (CPU workers: --device cpu)")
            connected = time.perf_counter()
            parts = list(batches(pending, batch_size)) if setup.static else \
                generate_ray.shares(pending, batch_size, pool.workers)
            blocks = generate_ray.decoded(parts, setup, pool.workers, pool.gpus_per_worker)
            generate_ray.write_outcomes(blocks, writer, tally, len(pending), progress)
            ended = time.perf_counter()
    except ray.exceptions.RayError as exc:   # Ray has logged its traceback already
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise click.ClickException(f"the Ray run stopped ({type(exc).__name__}: {why}); the {tally.written} "
                                   "line(s) written are kept: run the same command again to resume") from exc
    finally:
        writer.close()
        if started_ray:
            ray.shutdown()
    if pending:
        lines = summary_counts(tally, read_as, already_done, rejected + tally.rejected, ended - connected)
        lines.append(f"wall: {ended - started:.2f} s on {pool.workers} Ray worker(s), {connected - started:.2f} s "
                     f"of it starting Ray; tokens/s over the rest, the workers loading the models included")
    else:
        lines = summary_counts(tally, read_as, already_done, rejected, 0.0)
    click.echo("\n".join(lines), err=True)
    check_generated(tally.written, len(pending) - tally.rejected, already_done,
                    rejected + tally.rejected + tally.failed, strict)
