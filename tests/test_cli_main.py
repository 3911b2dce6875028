"""The `specsample` group: --version from the installed package's metadata, -h on every command."""
from importlib.metadata import version

import click
from click.testing import CliRunner

from cli import main


def _commands(group: click.Group, path=()):
    for name, command in group.commands.items():
        yield path + (name,)
        if isinstance(command, click.Group):
            yield from _commands(command, path + (name,))


def test_version():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"specsample, version {version('specsample-cupy')}\n"


def test_short_help_everywhere():
    paths = [()] + list(_commands(main))
    assert {("decode",), ("bench", "verify"), ("bench", "decode"), ("eval", "asr"), ("eval", "summarize")} <= set(paths)
    for path in paths:
        result = CliRunner().invoke(main, [*path, "-h"])
        assert result.exit_code == 0, (path, result.output)
        assert result.output.startswith("Usage:") and "-h, --help" in result.output, path
