"""The requests of `specsample generate`: one per line of its input, JSONL or plain text.

A bad line never stops the others: each one is returned as a Rejection (its line number and why) and
the command reports it and goes on. JSONL lines are {"id", "prompt"} objects, optionally with
"max_new_tokens", "temperature" and "seed" overriding the command's options; in a text file each
non-blank line is a prompt and its id is its line number.

A request's seed is the line's own "seed", or seeds.request_seed(the run's base seed, key_of_id(id)):
every request of a run draws from a stream of its own, the same whatever it is batched with and
whatever the order of the lines.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import NamedTuple

from specsample_cupy.batch.prompt_lines import input_lines, is_jsonl, json_object
from specsample_cupy.verification.api import SAMPLING_ONLY
from specsample_cupy.verification.seeds import key_of_id, request_seed

SEED_FROM_LINE, SEED_FROM_RUN = "line", "run"


class Settings(NamedTuple):
    """A request's settings. A static batch (one generate() call) shares max_new_tokens and temperature
    (batch_key); each request keeps its own seed."""
    max_new_tokens: int
    temperature: float
    seed: int               # the request's seed (as defaults given to read_requests: the run's base seed)
    seed_from: str = SEED_FROM_RUN   # "line": the line's own; "run": derived from the base seed and the id

    @property
    def batch_key(self) -> tuple:
        return self.max_new_tokens, self.temperature


@dataclass
class Request:
    id: object          # the line's "id" (JSONL) or its line number (text)
    key: str            # json.dumps(id): ids compare by this, in the input and in the output file
    line: int           # 1-based line number in the input
    prompt: str
    settings: Settings


@dataclass
class Rejection:
    line: int
    reason: str


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def run_seeded(defaults: Settings, request_id) -> Settings:
    """The defaults with the seed of request `request_id` derived from the run's base seed."""
    return defaults._replace(seed=request_seed(defaults.seed, key_of_id(request_id)), seed_from=SEED_FROM_RUN)


def _settings(obj: dict, defaults: Settings, method: str) -> Settings | str:
    """The line's settings (its fields over the defaults; its seed, or one derived from the base seed
    and its id), or why they are unusable."""
    max_new_tokens = obj.get("max_new_tokens", defaults.max_new_tokens)
    temperature = obj.get("temperature", defaults.temperature)
    seed = obj.get("seed", 0)
    if not _is_int(max_new_tokens) or max_new_tokens < 0:
        return '"max_new_tokens" must be an integer >= 0'
    if not (_is_int(temperature) or isinstance(temperature, float)) or not math.isfinite(temperature) \
            or temperature < 0:
        return '"temperature" must be a finite number >= 0'
    if temperature == 0 and method in SAMPLING_ONLY:
        return f'"temperature" 0 does not work with method {method!r}, which samples'
    if temperature != 0 and method == "greedy":
        return f'"temperature" {temperature} does not work with method \'greedy\', which takes the argmax (0 only)'
    if not _is_int(seed):
        return '"seed" must be an integer'
    if "seed" in obj:
        return Settings(max_new_tokens, float(temperature), seed, SEED_FROM_LINE)
    return run_seeded(defaults._replace(max_new_tokens=max_new_tokens, temperature=float(temperature)), obj["id"])


def _from_json_line(obj: dict | None, n: int, defaults: Settings, method: str, first_line: dict) -> Request | str:
    if obj is None:
        return "not a JSON object"
    if "id" not in obj:
        return 'no "id" field'
    if not (_is_int(obj["id"]) or isinstance(obj["id"], str)):
        return '"id" must be a string or an integer'
    key = json.dumps(obj["id"], ensure_ascii=False)
    # An id is taken by the first line that names it, even one rejected for another reason: two lines
    # with one id cannot both be that request.
    first = first_line.setdefault(key, n)
    if first != n:
        return f"duplicate id {key} (first on line {first})"
    if not isinstance(obj.get("prompt"), str):
        return 'no string "prompt" field'
    settings = _settings(obj, defaults, method)
    if isinstance(settings, str):
        return settings
    return Request(obj["id"], key, n, obj["prompt"], settings)


def read_requests(data: bytes, name: str, fmt: str, defaults: Settings, method: str
                  ) -> tuple[list[Request], list[Rejection], str]:
    """The requests of an input file's bytes, every line that is not one (with why, in line order), and
    the format read ("jsonl" or "text"). Blank lines are neither. defaults: the command's settings,
    its seed the run's base seed."""
    lines, undecodable = input_lines(data)   # prompt_lines: the rules `decode --prompt-file` reads by too
    rejections = [Rejection(n, why) for n, why in undecodable]
    requests = []
    objects = [json_object(text) for _, text in lines] if fmt != "text" else []
    if not is_jsonl(objects, name, fmt):
        return [Request(n, json.dumps(n), n, text, run_seeded(defaults, n)) for n, text in lines], rejections, "text"
    first_line = {}
    for (n, _), obj in zip(lines, objects):
        request = _from_json_line(obj, n, defaults, method, first_line)
        if isinstance(request, str):
            rejections.append(Rejection(n, request))
        else:
            requests.append(request)
    rejections.sort(key=lambda r: r.line)
    return requests, rejections, "jsonl"
