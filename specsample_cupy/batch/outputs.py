"""The output file of `specsample generate`: JSON lines appended as requests finish, and resumable.

A line is written with one flush, so a crash (even kill -9) can leave at most one torn line, the
last, with no newline after it. Opening the file for a run takes an exclusive lock (two runs
appending to one file would write ids twice), then cuts such a torn line away and collects the ids
of the complete lines: those requests are done, and the distinct settings they were written with
(batch/run_settings.py), which scan_file() also reads without opening the file for writing.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from specsample_cupy.batch.run_settings import canonical

try:
    import fcntl
except ImportError:   # not POSIX: runs go unlocked
    fcntl = None


class OutputBusy(RuntimeError):
    """Another run holds the output file."""


@dataclass
class Recovered:
    done: set = field(default_factory=set)        # keys (json.dumps(id)) of the complete lines' ids
    torn_bytes: int = 0                            # size of the torn last line cut away, 0 if none
    bad_lines: list = field(default_factory=list)  # complete lines that are no {"id": ...} object
    settings: dict = field(default_factory=dict)   # canonical settings -> (first line, settings) of the lines


def _scan(data: bytes) -> Recovered:
    """What a file's complete lines hold; everything after the last newline is a torn line."""
    complete = data[:data.rfind(b"\n") + 1]
    found = Recovered(torn_bytes=len(data) - len(complete))
    for n, raw in enumerate(complete.split(b"\n")[:-1], 1):
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            obj = None
        if isinstance(obj, dict) and "id" in obj:
            found.done.add(json.dumps(obj["id"], ensure_ascii=False))
            if isinstance(obj.get("settings"), dict):   # lines written before settings were recorded have none
                found.settings.setdefault(canonical(obj["settings"]), (n, obj["settings"]))
        elif raw.strip():
            found.bad_lines.append(n)
    return found


def scan_file(path: str) -> Recovered:
    """What an existing output file holds (nothing, when there is no such file); OSError when it
    cannot be read."""
    if not os.path.exists(path):
        return Recovered()
    with open(path, "rb") as f:
        return _scan(f.read())


def _sync_directory(path: str):
    """Make a new file's name durable too, not only its contents."""
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class ResultWriter:
    """Appends one JSON line per finished request to `path`; see the module docstring for resuming."""

    def __init__(self, path: str):
        created = not os.path.exists(path)
        self.file = open(path, "ab")
        try:
            self._lock()
            self.recovered = self._repair()
        except BaseException:
            self.file.close()
            raise
        if created:
            _sync_directory(path)

    def _lock(self):
        if fcntl is None:
            return
        try:
            fcntl.flock(self.file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise OutputBusy(f"{self.file.name}: another run is writing it") from exc

    def _repair(self) -> Recovered:
        with open(self.file.name, "rb") as f:
            found = _scan(f.read())
        if found.torn_bytes:
            fd = self.file.fileno()
            os.ftruncate(fd, os.fstat(fd).st_size - found.torn_bytes)
            os.fsync(fd)
        return found

    def write(self, obj: dict):
        """One complete line, handed to the operating system before this returns."""
        self.file.write((json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8"))
        self.file.flush()

    def sync(self):
        """Wait until the lines written so far are on the disk."""
        os.fsync(self.file.fileno())

    def close(self):
        if not self.file.closed:
            self.file.flush()
            self.sync()
            self.file.close()
