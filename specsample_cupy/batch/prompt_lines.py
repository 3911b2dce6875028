"""The one reader of prompt files, for `specsample decode --prompt-file` and `specsample generate --input`:
how a file's bytes split into lines and when it is read as JSONL.

- Lines end at \\n (or \\r\\n) only: str.splitlines() would also split a prompt at \\f, \\x1c or \\u2028.
- Each line is UTF-8 on its own, so one bad byte costs one line (undecodable lines come back with why).
- Blank lines (whitespace only) are skipped; line numbers count them, starting at 1.
- JSONL when asked, or (format "auto") when the name ends in .jsonl or most non-blank lines are JSON
  objects: a few malformed lines are then bad lines of a JSONL file, not a sign of a text file.
"""
from __future__ import annotations

import json

FORMATS = ("auto", "jsonl", "text")


def input_lines(data: bytes) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(the non-blank lines as (line number, text), the undecodable ones as (line number, why))."""
    lines, undecodable = [], []
    for n, raw in enumerate(data.split(b"\n"), 1):
        try:
            text = raw.removesuffix(b"\r").decode("utf-8")
        except UnicodeDecodeError as exc:
            undecodable.append((n, f"not UTF-8 text ({exc.reason} at byte {exc.start})"))
            continue
        if text.strip():
            lines.append((n, text))
    return lines, undecodable


def json_object(line: str) -> dict | None:
    """The line as a JSON object, or None (not JSON, or JSON but not an object)."""
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def is_jsonl(objects: list[dict | None], name: str, fmt: str = "auto") -> bool:
    """Whether a file named `name` whose non-blank lines parse as `objects` (json_object()) is JSONL
    (module docstring)."""
    if fmt != "auto":
        return fmt == "jsonl"
    return name.endswith(".jsonl") or 2 * sum(o is not None for o in objects) > len(objects)
