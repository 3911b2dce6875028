"""The training/evaluation corpus: the Python standard library's own source.

Files are split, not lines: every HOLDOUT_EVERY-th file in path order is
held out for evaluation, so no held-out text is seen in training.
Third-party packages (site-packages) are excluded.
"""
from __future__ import annotations

import os
import sysconfig

HOLDOUT_EVERY = 20
EOS_TOKEN = "<|endoftext|>"


def stdlib_dir() -> str:
    return sysconfig.get_paths()["stdlib"]


def list_files(root: str | None = None) -> list[str]:
    """Relative paths of all stdlib .py files, sorted (the split depends on it)."""
    root = root or stdlib_dir()
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in ("site-packages", "dist-packages", "__pycache__"))
        rel = os.path.relpath(dirpath, root)
        out.extend(os.path.normpath(os.path.join(rel, f)) for f in filenames if f.endswith(".py"))
    return sorted(out)


def split_files(files: list[str]) -> tuple[list[str], list[str]]:
    """(train, heldout): file i (in sorted order) is held out iff i % HOLDOUT_EVERY == 0."""
    train = [f for i, f in enumerate(files) if i % HOLDOUT_EVERY]
    held = [f for i, f in enumerate(files) if not i % HOLDOUT_EVERY]
    return train, held


def read_texts(files: list[str], root: str | None = None) -> list[str]:
    """File contents as UTF-8 text; undecodable or empty files are skipped."""
    root = root or stdlib_dir()
    texts = []
    for f in files:
        try:
            with open(os.path.join(root, f), encoding="utf-8") as fh:
                text = fh.read()
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            texts.append(text)
    return texts
