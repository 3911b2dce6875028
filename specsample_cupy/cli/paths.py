"""Output paths checked before a command works: a run that could not write its results fails in its first
second with one line, not after the models loaded and the work ran.

Whether a path can be written is found out by trying, not by os.access(): root passes every permission
check, yet cannot create a file on a read-only file system or in /proc. An existing file is opened
for appending (nothing written, so it is left as it was); for a new file a temporary file is created
and removed in its folder.
"""
from __future__ import annotations

import importlib.util
import os
import tempfile

import click


class OutputPathError(click.ClickException):
    """An output path that cannot be written (printed as one line, exit status 1)."""


def _nearest_folder(folder: str) -> str:
    """folder, or its nearest ancestor that exists (what a writer that creates folders writes in)."""
    while not os.path.exists(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return folder


def why_not_writable(path: str, make_parents: bool = False) -> str | None:
    """None when `path` can be written as a file, else why not. make_parents: the writer creates missing
    folders (then the nearest existing one must take new entries)."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        return "it is a folder"
    if os.path.exists(path):
        try:
            with open(path, "ab"):
                pass
        except OSError as exc:
            return exc.strerror or str(exc)
        return None
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        if not make_parents:
            return f"its folder {folder} does not exist"
        folder = _nearest_folder(folder)
        if not os.path.isdir(folder):
            return f"{folder} is not a folder"
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".specsample-write-check-"):
            pass
    except OSError as exc:
        return f"cannot create files in {folder} ({exc.strerror or exc})"
    return None


def check_writable(path: str | None, option: str, make_parents: bool = False) -> None:
    """OutputPathError naming the option and the path unless it can be written; None: no such output."""
    if path is None or path == "-":
        return
    why = why_not_writable(path, make_parents)
    if why is not None:
        raise OutputPathError(f"{option} {path}: cannot write it: {why}")


def check_plot(path: str | None, option: str = "--plot", make_parents: bool = False) -> None:
    """check_writable, and matplotlib importable (a plot is drawn after the work: found missing
    then, the run's figures would be lost to an ImportError)."""
    if path is None:
        return
    check_writable(path, option, make_parents)
    if importlib.util.find_spec("matplotlib") is None:
        raise OutputPathError(f"{option} needs matplotlib: pip install matplotlib")


def os_error(exc: OSError) -> click.ClickException:
    """A file that failed the run (a write at its end: a full disk, a folder removed meanwhile) as one
    line naming the file, for `raise os_error(exc) from exc`."""
    where = f"{exc.filename}: " if exc.filename else ""
    return click.ClickException(f"{where}{exc.strerror or exc}")
