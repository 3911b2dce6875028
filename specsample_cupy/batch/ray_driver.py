"""The driver of `specsample generate --ray`: the pending requests, in shares, as a Ray dataset decoded by
a pool of DecodeWorker actors, their lines written to the output file here, in this process, as they
come.

Ray does the scheduling, the restarts and the retries: a worker that dies (a crashed process, a lost
node) is restarted, loading the models again, and its share runs again. A share that ran twice may
reach the driver twice, so the driver keeps the first outcome of each id and drops any later one:
each id is written once, and the file is fsync'ed after each share's outcomes.
"""
from __future__ import annotations

import json
import math
import sys
import warnings
from dataclasses import dataclass

from specsample_cupy.batch.inputs import Request
from specsample_cupy.batch.ray_worker import REJECTED, WRITTEN, DecodeWorker, WorkerSetup, share_row

# How often a worker that died is replaced and its share retried before the run fails; bounded, so
# that a share that kills every worker (say, one that runs a GPU out of memory) ends the run.
RESTARTS = 3

# A worker decodes a share in one generate_stream() call, whose last rounds run with fewer and fewer
# rows busy as its requests finish: every share costs such a tail. On the CPU pair (48 tokens each,
# 16 rows) 192 requests in shares of 3 batches' worth took 32 % more rounds than in one share, in
# shares of 6 9 % more; 768 requests in shares of 12 8 %, of 24 3 %. So a share holds at least
# SHARE_MIN_BATCHES batches' worth, and a worker gets few shares: two, so that one that starts late
# or runs slower takes fewer (a share goes to whichever worker is free). SHARE_MAX_BATCHES bounds
# what a worker that dies takes with it and how long the lines of a long run wait to reach the file.
SHARE_MIN_BATCHES = 6
SHARES_PER_WORKER = 2
SHARE_MAX_BATCHES = 64


def shares(requests: list, batch_size: int, workers: int) -> list[list]:
    """The requests, in input order, as near-equal shares for continuous batching (the sizes above),
    their number a multiple of the workers: equal shares keep every worker busy to the end."""
    n = len(requests)
    size = math.ceil(n / (workers * SHARES_PER_WORKER))
    size = min(max(size, SHARE_MIN_BATCHES * batch_size), SHARE_MAX_BATCHES * batch_size)
    count = min(math.ceil(math.ceil(n / size) / workers) * workers, n)
    bounds = [n * k // count for k in range(count + 1)]
    return [requests[a:b] for a, b in zip(bounds, bounds[1:])]


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


def decoded(parts: list[list[Request]], setup: WorkerSetup, workers: int, gpus_per_worker: float,
            worker=DecodeWorker, restarts: int = RESTARTS):
    """The outcome blocks (pyarrow tables) of the shares (static batches with setup.static), each as
    soon as its worker has it."""
    import ray.data

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False     # the command's own bar counts requests
    # One block per share: a worker takes one share at a time and its lines come back when it ends.
    dataset = ray.data.from_items([share_row(p) for p in parts], override_num_blocks=len(parts))
    resources = {"num_gpus": gpus_per_worker} if gpus_per_worker > 0 else {"num_cpus": 1}
    with warnings.catch_warnings():
        # Ray 2.60 deprecates passing actor options as keywords, with no named parameter for these two
        # yet (pyproject.toml keeps Ray below 2.64, which drops them). Ray Data's own default is to
        # restart and retry without end, which a share that kills every worker would never leave.
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        # A share goes to a worker only once it is free (Ray Data would queue a second one on a busy
        # worker), so a worker that finishes early takes the next share instead of waiting.
        pool = ray.data.ActorPoolStrategy(size=workers, max_tasks_in_flight_per_actor=1)
        outcomes = dataset.map_batches(worker, fn_constructor_args=(setup,), batch_size=1, batch_format="pyarrow",
                                       compute=pool, max_restarts=restarts, max_task_retries=restarts, **resources)
    return outcomes.iter_batches(batch_size=None, batch_format="pyarrow")


def write_outcomes(blocks, writer, tally: Tally, total: int, progress: bool):
    """Write each id's line once, in the order the blocks come, counting it in `tally`, and report on
    stderr the requests that were rejected or failed; the file is synced after every block."""
    from tqdm import tqdm

    seen = set()
    with tqdm(total=total, disable=not progress, unit="req", file=sys.stderr, dynamic_ncols=True) as bar:
        for block in blocks:
            for outcome in block.to_pylist():
                if outcome["key"] in seen:   # a retried share's second answer
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
