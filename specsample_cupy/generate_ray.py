"""The driver of `specsample generate --ray`: the pending batches as a Ray dataset, decoded by a pool of
DecodeWorker actors, their lines written to the output file here, in this process, as they come.

Ray does the scheduling, the restarts and the retries: a worker that dies (a crashed process, a lost
node) is restarted, loading the models again, and its batch runs again. A batch that ran twice may
reach the driver twice, so the driver keeps the first outcome of each id and drops any later one:
each id is written once, and the file is fsync'ed after each batch's outcomes, as in the
single-process runner.
"""
from __future__ import annotations

import json
import sys
import warnings
from dataclasses import dataclass

from specsample_cupy.generate_input import Request
from specsample_cupy.generate_ray_worker import REJECTED, WRITTEN, DecodeWorker, WorkerSetup, batch_row

# How often a worker that died is replaced and its batch retried before the run fails; bounded, so
# that a batch that kills every worker (say, one that runs a GPU out of memory) ends the run.
RESTARTS = 3


@dataclass
class Tally:
    """What the run's lines add up to, under the names the summary reads from a Runner."""
    written: int = 0
    failed: int = 0
    rejected: int = 0
    tokens: int = 0
    proposed: int = 0
    accepted: int = 0

    def add(self, line: dict):
        self.written += 1
        self.tokens += line["new_tokens"]
        self.proposed += line["proposed"]
        self.accepted += line["accepted"]


def connect(address: str | None, workers: int) -> bool:
    """Join the cluster at `address`, or start a local Ray with a CPU for each worker; reuse a Ray this
    process has started already. True when this call started one (the caller then shuts it down)."""
    import ray

    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address)
    else:
        # "local": a new Ray of its own, even where `ray start` runs one (--ray-address auto joins that).
        # GPUs are found by Ray itself; the CPUs are capped so that CPU workers get a core each.
        ray.init(address="local", num_cpus=workers, include_dashboard=False)
    return True


def missing_gpus(workers: int, gpus_per_worker: float) -> str | None:
    """Why the cluster as it is now cannot hold the workers' GPUs (a pool that waits for them would
    wait forever), or None when it can."""
    import ray

    needed = workers * gpus_per_worker
    available = ray.cluster_resources().get("GPU", 0)
    if needed > available:
        return f"{workers} worker(s) of {gpus_per_worker:g} GPU(s) need {needed:g} GPUs; Ray has {available:g}"
    return None


def decoded(batches: list[list[Request]], setup: WorkerSetup, workers: int, gpus_per_worker: float,
            worker=DecodeWorker, restarts: int = RESTARTS):
    """The outcome blocks (pyarrow tables) of the batches, each as soon as its worker has it."""
    import ray.data

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False     # the command's own bar counts requests
    # One block per batch: a worker takes one batch at a time and its lines come back when it ends.
    dataset = ray.data.from_items([batch_row(b) for b in batches], override_num_blocks=len(batches))
    resources = {"num_gpus": gpus_per_worker} if gpus_per_worker > 0 else {"num_cpus": 1}
    with warnings.catch_warnings():
        # Ray 2.60 deprecates passing actor options as keywords, with no named parameter for these two
        # yet (pyproject.toml keeps Ray below 2.64, which drops them). Ray Data's own default is to
        # restart and retry without end, which a batch that kills every worker would never leave.
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        outcomes = dataset.map_batches(worker, fn_constructor_args=(setup,), batch_size=1, batch_format="pyarrow",
                                       compute=ray.data.ActorPoolStrategy(size=workers), max_restarts=restarts,
                                       max_task_retries=restarts, **resources)
    return outcomes.iter_batches(batch_size=None, batch_format="pyarrow")


def write_outcomes(blocks, writer, tally: Tally, total: int, progress: bool):
    """Write each id's line once, in the order the blocks come, counting it in `tally`, and report on
    stderr the requests that were rejected or failed; the file is synced after every block."""
    from tqdm import tqdm

    seen = set()
    with tqdm(total=total, disable=not progress, unit="req", file=sys.stderr, dynamic_ncols=True) as bar:
        for block in blocks:
            for outcome in block.to_pylist():
                if outcome["key"] in seen:   # a retried batch's second answer
                    continue
                seen.add(outcome["key"])
                if outcome["outcome"] == WRITTEN:
                    line = json.loads(outcome["result"])
                    writer.write(line)
                    tally.add(line)
                else:
                    bar.write(outcome["report"], file=sys.stderr)
                    tally.rejected += outcome["outcome"] == REJECTED
                    tally.failed += outcome["outcome"] != REJECTED
                bar.update(1)
            writer.sync()
            bar.set_postfix_str(f"{tally.tokens} tokens", refresh=False)
