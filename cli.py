"""`specsample` command line: decode | bench | eval."""
import click

from specsample_cupy.cli_bench import bench
from specsample_cupy.cli_decode import decode
from specsample_cupy.cli_eval import eval_group


@click.group()
def main():
    """Speculative sampling on NVIDIA GPUs (CuPy + ONNX Runtime)."""


main.add_command(decode)
main.add_command(bench)
main.add_command(eval_group, name="eval")

if __name__ == "__main__":
    main()
