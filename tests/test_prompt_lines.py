"""One reader of prompt files: `decode --prompt-file` and `generate --input` split lines, skip blank
ones, decode UTF-8 per line and decide JSONL by the same rule (batch/prompt_lines.py)."""
import json

import click
import pytest

from specsample_cupy.batch.inputs import Settings, read_requests
from specsample_cupy.batch.prompt_lines import input_lines, is_jsonl, json_object
from specsample_cupy.cli.decode import parse_prompt_file

DEFAULTS = Settings(16, 1.0, 0)


def test_lines_end_at_newline_only():
    lines, bad = input_lines("a\fb\r\n\n  \nc\x1cd\u2028\nlast".encode())
    assert lines == [(1, "a\fb"), (4, "c\x1cd\u2028"), (5, "last")] and bad == []


def test_an_undecodable_line_costs_that_line():
    lines, bad = input_lines(b"ok\n\xff\xfe\nfine\n")
    assert lines == [(1, "ok"), (3, "fine")]
    assert [n for n, _ in bad] == [2] and "not UTF-8 text" in bad[0][1]


@pytest.mark.parametrize("objects, name, fmt, expected", [
    ([{}, {}, None], "d.txt", "auto", True),      # most lines are objects: a malformed line is a bad line
    ([{}, None], "d.txt", "auto", False),         # half is not most
    ([None, None], "d.jsonl", "auto", True),      # the name says so
    ([{}, {}], "d.jsonl", "text", False),         # asked
    ([None], "d.txt", "jsonl", True),
])
def test_the_jsonl_rule(objects, name, fmt, expected):
    assert is_jsonl(objects, name, fmt) is expected


def test_json_object_only_objects():
    assert json_object('{"prompt": "x"}') == {"prompt": "x"}
    assert json_object("[1]") is None and json_object("{oops") is None and json_object("3") is None


@pytest.mark.parametrize("data, name", [
    (b"the sea\n\nhello there\r\n", "p.txt"),
    (b'{"id": 1, "prompt": "the sea"}\n{"id": 2, "prompt": "hello\\nthere"}\n', "p.txt"),
    (b'{"id": 1, "prompt": "the sea"}\n', "p.jsonl"),
    (b'the sea\n{"id": 1, "prompt": "x"}\n', "p.txt"),
])
def test_decode_and_generate_read_a_file_alike(data, name):
    prompts = parse_prompt_file(data, name)
    requests, rejections, _ = read_requests(data, name, "auto", DEFAULTS, "exact")
    assert rejections == []
    assert [p.text for p in prompts] == [r.prompt for r in requests]
    assert [p.source for p in prompts] == [f"{name}:{r.line}" for r in requests]


def test_decode_refuses_a_mostly_json_file_with_a_bad_line():
    data = "\n".join([json.dumps({"id": 1, "prompt": "a"}), json.dumps({"id": 2, "prompt": "b"}), "plain"]).encode()
    with pytest.raises(click.ClickException, match=r"p.txt:3: not a JSON object"):
        parse_prompt_file(data, "p.txt")
    _, rejections, read_as = read_requests(data, "p.txt", "auto", DEFAULTS, "exact")
    assert read_as == "jsonl" and [r.line for r in rejections] == [3]
