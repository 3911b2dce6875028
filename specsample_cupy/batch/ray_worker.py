"""The Ray side of `specsample generate --ray`: a share of the pending requests as one dataset row, and
the actor that decodes such rows.

A row is one share of the work (ray_driver.shares), decoded the way the single-process runner
decodes: by default with continuous batching, one generate_stream() call of --batch-size rows over
the share's requests, each with its own settings, so every request gets the tokens it gets decoded
alone; with static batching (--static, or options continuous batching does not take) a share is one
batch of batch/runner.py's rule (equal settings, at most --batch-size requests), one generate() call.
A worker answers a row with one outcome row per request: the request's output line as JSON, or the
message the command reports for it (a prompt too long for the context, requests the decoder
refused). Only plain pyarrow types cross the process boundary; ids travel as their JSON keys, so
string and integer ids can share a column, and settings as JSON, so a seed may be any integer.
"""
from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specsample_cupy.batch.common import fitting
from specsample_cupy.batch.inputs import Request, Settings
from specsample_cupy.batch.runner import DecodeOptions, Runner
from specsample_cupy.cli.decode import load_decoder

if TYPE_CHECKING:
    import pyarrow as pa

WRITTEN, REJECTED, FAILED = "written", "rejected", "failed"


def share_row(requests: list[Request]) -> dict:
    """Requests as one dataset row, each with its settings."""
    return {"keys": [r.key for r in requests], "lines": [r.line for r in requests],
            "prompts": [r.prompt for r in requests], "settings": [json.dumps(r.settings) for r in requests]}


def requests_of(row: dict) -> list[Request]:
    """The requests a row holds, as read from the input."""
    return [Request(json.loads(key), key, line, prompt, Settings(*json.loads(settings)))
            for key, line, prompt, settings in zip(row["keys"], row["lines"], row["prompts"], row["settings"])]


@dataclass
class WorkerSetup:
    """What every worker loads and applies: the pair, where it runs, and the run's decode options."""
    name: str                # the input's name, for FILE:LINE in messages
    target: str | None
    draft: str | None
    device: str
    ngram_min: int
    ngram_max: int
    options: DecodeOptions
    batch_size: int = 8      # the rows of each generate_stream() call
    static: bool = False     # a row is one static batch (one generate() call)


class _Lines:
    """A ResultWriter stand-in that keeps the runner's lines for the outcome rows: the driver writes them."""

    def __init__(self):
        self.lines = []

    def write(self, obj: dict):
        self.lines.append(obj)

    def sync(self):
        pass


class _RefusalKept:
    """The decoder, keeping the ValueError with which it refused requests: the runner catches it, and the
    driver has to report it."""

    def __init__(self, decoder):
        self.decoder, self.refusal = decoder, None

    def __getattr__(self, name):
        return getattr(self.decoder, name)

    def generate(self, *args, **kwargs):
        try:
            return self.decoder.generate(*args, **kwargs)
        except ValueError as exc:
            self.refusal = exc
            raise

    def generate_stream(self, *args, **kwargs):
        # A refusal may come at the call (the arguments) or from a later round.
        try:
            yield from self.decoder.generate_stream(*args, **kwargs)
        except ValueError as exc:
            self.refusal = exc
            raise


class DecodeWorker:
    """A Ray Data callable class: each actor of the pool loads the pair once, here, and then decodes the
    rows it is handed, one generate_stream() call each (one generate() call with static batching)."""

    def __init__(self, setup: WorkerSetup):
        self.name, self.batch_size, self.static = setup.name, setup.batch_size, setup.static
        # A CPU worker reserves one CPU (generate_ray.decoded): its model runs use one thread, so the
        # workers of a machine do not contend for its cores.
        self.decoder = _RefusalKept(load_decoder(setup.target, setup.draft, setup.device,
                                                 ngram_min=setup.ngram_min, ngram_max=setup.ngram_max,
                                                 cpu_threads=1 if setup.device == "cpu" else None,
                                                 batch_layout=setup.batch_size > 1))
        self.lines = _Lines()
        self.runner = Runner(self.decoder, self.lines, setup.options, 0, progress=False)

    def __call__(self, rows: pa.Table) -> pa.Table:
        import pyarrow as pa   # Ray Data's own dependency, there wherever this runs

        outcomes = []
        for row in rows.to_pylist():
            requests = requests_of(row)
            outcomes += self.decode(requests) if self.static else self.decode_stream(requests)
        schema = pa.schema([(column, pa.string()) for column in ("key", "outcome", "result", "report")])
        return pa.Table.from_pylist(outcomes, schema=schema)

    def decode(self, batch: list[Request]) -> list[dict]:
        """Outcome rows for one static batch (equal settings), one per request: one generate() call."""
        return self._outcomes(batch, lambda kept: self.runner.run(kept, str))

    def decode_stream(self, requests: list[Request]) -> list[dict]:
        """Outcome rows for requests of any settings, one per request: one generate_stream() call."""
        return self._outcomes(requests, lambda kept: self.runner.run_stream(kept, self.batch_size, str))

    def _outcomes(self, requests: list[Request], run) -> list[dict]:

        kept, refusals = fitting(self.decoder, requests, self.name)
        outcomes = [_outcome(r, REJECTED, report=f"{why}; skipped") for r, why in refusals]
        if not kept:
            return outcomes
        self.lines.lines, self.decoder.refusal = [], None
        # The runner reports refused requests on stderr itself; here the driver does, so that the
        # message reaches the user once and in the single-process form.
        with contextlib.redirect_stderr(io.StringIO()):
            run(kept)
        written = {json.dumps(line["id"], ensure_ascii=False): line for line in self.lines.lines}
        for r in kept:
            if r.key in written:
                outcomes.append(_outcome(r, WRITTEN, result=json.dumps(written[r.key], ensure_ascii=False)))
            else:
                outcomes.append(_outcome(r, FAILED, report=f"{self.name}:{r.line}: not generated: "
                                                           f"{self.decoder.refusal}"))
        return outcomes


def _outcome(request: Request, outcome: str, result: str = "", report: str = "") -> dict:
    return {"key": request.key, "outcome": outcome, "result": result, "report": report}
