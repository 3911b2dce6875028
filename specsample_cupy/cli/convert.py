"""`specsample convert HF_DIR OUT_DIR`: a Hugging Face checkpoint folder into the decoder format."""
import click

from specsample_cupy.cli.decode import CONTEXT_SETTINGS


@click.command("convert", context_settings=CONTEXT_SETTINGS)
@click.argument("hf_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--dtype", type=click.Choice(["float16", "float32"]), default="float16", show_default=True,
              help="float16 for CUDA (weights, arithmetic, cache and logits); float32 for the CPU.")
@click.option("--attention", type=click.Choice(["onnx", "gqa"]), default="onnx", show_default=True,
              help="onnx: a masked cache, any batch, CPU and CUDA. gqa: ONNX Runtime's GroupQueryAttention over "
                   "one buffer written in place: faster on CUDA (float16), one prompt per call.")
@click.option("--overwrite", is_flag=True, help="Replace OUT_DIR if it exists and is not empty.")
def convert(hf_dir, out_dir, dtype, attention, overwrite):
    """Convert a Llama, Qwen2, Mistral or GPT-2 checkpoint (safetensors, no torch needed), or an ONNX
    Runtime GenAI builder folder or optimum ONNX export of a Llama, Qwen2 or Mistral model, into a model
    folder that `specsample decode --target/--draft` runs with CUDA graphs, at any batch size."""
    from specsample_cupy.convert import ConversionError
    from specsample_cupy.convert import convert as run_convert

    try:
        out = run_convert(hf_dir, out_dir, dtype=dtype, overwrite=overwrite, attention=attention)
    except ConversionError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {out}")
