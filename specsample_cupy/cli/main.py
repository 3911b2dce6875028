"""`specsample` command line: decode | generate | bench | eval | convert (the console script; cli.py at the
repository root runs it from a checkout)."""
import click

from specsample_cupy.cli.bench import bench
from specsample_cupy.cli.convert import convert
from specsample_cupy.cli.decode import decode
from specsample_cupy.cli.eval import eval_group
from specsample_cupy.cli.generate import generate

# -h as well as --help, for the group and (inherited through click's context) every command under it.
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(package_name="specsample-cupy", prog_name="specsample")
def main():
    """Speculative sampling on NVIDIA GPUs (CuPy + ONNX Runtime)."""


main.add_command(decode)
main.add_command(generate)
main.add_command(bench)
main.add_command(eval_group, name="eval")
main.add_command(convert)

if __name__ == "__main__":
    main()
