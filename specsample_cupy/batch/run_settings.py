"""What shaped a `specsample generate` run's lines, recorded in every line, and the check that a resume
keeps it.

Each output line holds "settings": the run's method, gamma policy, default temperature and
max_new_tokens, truncation (top-k/top-p/min-p), stop strings, base seed with the rule that derives
each request's seed from it (and whether the base was given or drawn at random), and the two model
folders with a fingerprint of each. The line's own "max_new_tokens", "temperature", "seed" and
"seed_from" ("line": the input line's own seed; "run": derived from the base seed and the id) say what
that request used.

A resume compares the run's settings with every distinct "settings" the file's lines hold and refuses
the first difference (SettingsMismatch), unless forced. Folders are not compared, their fingerprints
are (a model moved or copied elsewhere is the same model), nor is the seed's origin (a resume with
--seed random takes the file's base seed: generate_seed()).

A fingerprint is the SHA-256, in 16 hex digits, of each file of the folder (sorted relative names,
recursively): its name, size, first and last MiB. Reading 2 MiB a file keeps it cheap for
multi-gigabyte models; a change in the middle of a file of unchanged size goes unseen, which the
weights of another model or another export do not do. Modification times are left out so that a
copy of the same files fingerprints the same.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from specsample_cupy.decode.ngram import NGRAM
from specsample_cupy.settings import SamplingSettings

FINGERPRINT_CHUNK = 1 << 20
SEED_RULE = "request_seed(seed, key_of_id(id)) unless the line has its own seed (specsample_cupy/verification/seeds.py)"
NOT_COMPARED = ("seed_origin", "target", "draft")


class SettingsMismatch(ValueError):
    """A resume whose settings differ from those of the output file's lines."""


def model_fingerprint(folder) -> str:
    """The folder's fingerprint (module docstring)."""
    folder = Path(folder)
    digest = hashlib.sha256()
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    for path in files:
        size = path.stat().st_size
        digest.update(f"{path.relative_to(folder).as_posix()}\0{size}\0".encode())
        with open(path, "rb") as f:
            digest.update(f.read(FINGERPRINT_CHUNK))
            if size > FINGERPRINT_CHUNK:
                f.seek(max(FINGERPRINT_CHUNK, size - FINGERPRINT_CHUNK))
                digest.update(f.read(FINGERPRINT_CHUNK))
    return digest.hexdigest()[:16]


def model_folders(target, draft) -> tuple[Path, Path | None]:
    """The pair's folders as the decoder resolves them (None, for draft="ngram"); the embedded pair by
    default."""
    from specsample_cupy.decode.decoder import default_model_dir   # imports onnxruntime only when decoding

    target = Path(target) if target is not None else default_model_dir("target")
    if draft == NGRAM:
        return target, None
    return target, Path(draft) if draft is not None else default_model_dir("draft")


def run_settings(*, sampling: SamplingSettings, seed_origin: str, target, draft, ngram_min: int,
                 ngram_max: int) -> dict:
    """The settings every line of the run records: the sampling settings' record() (its seed: the run's
    base seed), the seed's rule and origin, and the models; target/draft as the options give them (None:
    the embedded pair). OSError when a model folder cannot be read."""
    target_dir, draft_dir = model_folders(target, draft)
    settings = {
        **sampling.record(), "seed_rule": SEED_RULE, "seed_origin": seed_origin,
        "target": str(target_dir.resolve()), "target_fingerprint": model_fingerprint(target_dir),
    }
    if draft_dir is None:
        settings.update(draft=NGRAM, draft_fingerprint=None, ngram=[ngram_min, ngram_max])
    else:
        settings.update(draft=str(draft_dir.resolve()), draft_fingerprint=model_fingerprint(draft_dir))
    return settings


def canonical(settings: dict) -> str:
    """One string per distinct settings (key order does not matter)."""
    return json.dumps(settings, sort_keys=True, ensure_ascii=False)


def first_difference(recorded: dict, current: dict) -> str | None:
    """'KEY: the file has A, this run B' for the first compared key (in this run's order) that differs,
    else None."""
    keys = list(current) + [k for k in recorded if k not in current]
    for key in keys:
        if key in NOT_COMPARED:
            continue
        was, now = recorded.get(key, "nothing"), current.get(key, "nothing")
        if was != now:
            return f"{key}: the file has {json.dumps(was)}, this run {json.dumps(now)}"
    return None


def check_resume(recorded: dict, current: dict, path: str, force: bool) -> None:
    """recorded: {canonical settings: (first line, settings)} of the file's lines. SettingsMismatch for
    the first line whose settings differ from `current`, unless force."""
    if force:
        return
    for line, settings in sorted(recorded.values(), key=lambda v: v[0]):
        why = first_difference(settings, current)
        if why is not None:
            raise SettingsMismatch(f"{path}:{line} was written with other settings ({why}); use the same options "
                                   "to resume, another --output, or --force-settings to mix them")


def recorded_base_seed(recorded: dict) -> int | None:
    """The base seed of the file's last settings written, if any (a resume with --seed random takes it)."""
    if not recorded:
        return None
    seed = max(recorded.values(), key=lambda v: v[0])[1].get("seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None
