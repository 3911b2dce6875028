"""`specsample bench verify | decode`."""
import json

import click

from specsample_cupy.bench.decode import bench_decode
from specsample_cupy.cli.paths import check_plot, check_writable, os_error


def _ints(text):
    return [int(x) for x in text.split(",") if x]


@click.group()
def bench():
    """Benchmarks (a CUDA device, except bench verify --device cpu)."""


@bench.command("verify")
@click.option("--methods", default="baseline,exact,sigmoid", show_default=True,
              help="verify methods, and exact-onehot: exact verification without draft logits")
@click.option("--warp", "warp_specs", multiple=True, metavar="SPEC",
              help='Also time exact verification with this truncation, e.g. "top_p=0.9" or '
                   '"top_k=50,top_p=0.9" (repeatable).')
@click.option("--vocab", default="32000,51864,151936,256000", show_default=True)
@click.option("--gamma", default="1,3,5,8", show_default=True)
@click.option("--batch", default="1,8,64", show_default=True)
@click.option("--dtype", "dtypes", default="float32,float16", show_default=True)
@click.option("--reps", default=30, show_default=True, help="timed calls per configuration")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="write every number here")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="cpu: NumPy inputs (the CPU reference and the NumPy baseline), wall and CPU time")
def bench_verify(methods, warp_specs, vocab, gamma, batch, dtypes, reps, json_path, device):
    """Device and wall time per verify() call, bandwidth, speed-up over the baseline."""
    check_writable(json_path, "--json")
    from rich.markup import escape   # method names like exact[top_p=0.9] are not markup
    from rich.table import Table
    from tqdm import tqdm

    from specsample_cupy.bench import verify as bv
    progress = lambda g: tqdm(g, desc="configs", leave=False)
    methods = methods.split(",") + [bv.warped("exact", spec) for spec in warp_specs]
    try:
        for name in methods:
            bv.parse_method(name)
    except ValueError as exc:
        raise click.UsageError(str(exc))
    if device == "cpu":
        result = bv.run_cpu(methods, _ints(vocab), _ints(gamma), _ints(batch), dtypes.split(","),
                            reps=reps, progress=progress)
        table = Table(title=f"verify() on the CPU: {result['device']} (NumPy {result['numpy']}, medians)")
        for col in ("dtype", "V", "γ", "B", "method", "wall µs", "CPU µs", "× baseline (wall)", "× baseline (CPU)"):
            table.add_column(col, justify="right")
        for r in result["rows"]:
            table.add_row(r["dtype"], str(r["V"]), str(r["gamma"]), str(r["B"]), escape(r["method"]),
                          f"{r['wall_us']:.0f}", f"{r['cpu_us']:.0f}",
                          f"{r.get('wall_speedup_vs_baseline', float('nan')):.2f}",
                          f"{r.get('cpu_speedup_vs_baseline', float('nan')):.2f}")
        _report(table, result, json_path)
        return
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
    except ImportError as exc:
        raise click.ClickException(f"bench verify needs CuPy ({exc})")
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise click.ClickException(f"bench verify needs a CUDA device ({exc})")
    result = bv.run(methods, _ints(vocab), _ints(gamma), _ints(batch), dtypes.split(","),
                    reps=reps, progress=progress)
    table = Table(title=f"verify() on {result['device']} (copy bandwidth {result['copy_bandwidth_gbps']:.0f} GB/s)")
    for col in ("dtype", "V", "γ", "B", "method", "device µs", "wall µs", "GB/s", "% copy BW", "× baseline (wall)"):
        table.add_column(col, justify="right")
    for r in result["rows"]:
        table.add_row(r["dtype"], str(r["V"]), str(r["gamma"]), str(r["B"]), escape(r["method"]),
                      f"{r['device_us']:.1f}", f"{r['wall_us']:.1f}", f"{r['gbps']:.0f}",
                      f"{100 * r['copy_bw_fraction']:.0f}", f"{r.get('wall_speedup_vs_baseline', float('nan')):.1f}")
    _report(table, result, json_path)


def _report(table, result, json_path):
    from rich.console import Console
    Console(width=160).print(table)
    if json_path:
        try:
            with open(json_path, "w") as f:
                json.dump(result, f, indent=1)
        except OSError as exc:
            raise os_error(exc) from exc
        click.echo(f"wrote {json_path}")


def _outputs_checked_first(command: click.Command, json_name: str, plot_name: str) -> click.Command:
    """The command with its --json and --plot (parameter names) checked before it runs, and a file that
    fails it as one line, not a traceback (bench/decode.py writes its files at the end)."""
    def callback(**kwargs):
        check_writable(kwargs.get(json_name), "--json")
        check_plot(kwargs.get(plot_name))
        try:
            return command.callback(**kwargs)
        except OSError as exc:
            raise os_error(exc) from exc

    return click.Command(command.name, context_settings=command.context_settings, callback=callback,
                         params=command.params, help=command.help, epilog=command.epilog,
                         short_help=command.short_help, options_metavar=command.options_metavar)


bench.add_command(_outputs_checked_first(bench_decode, "json_path", "plot_path"), name="decode")
