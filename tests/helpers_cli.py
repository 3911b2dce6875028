"""What the CLI tests share."""
from click.testing import CliRunner


def split_runner():
    """A runner that keeps stderr apart from stdout (click 8.1 needs asking; 8.2 always does)."""
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:
        return CliRunner()
