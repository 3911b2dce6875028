"""An ONNX Runtime GenAI builder folder opened for batches (SpeculativeDecoder(batch_layout=True); the
CLI's runs of several prompts) loads through its conversion, made once into the cache
(convert/cache.batching_folder): a ragged batch decodes in one call, token for token as the checkpoint
converted directly; `specsample generate` batches it. A builder folder the converter refuses loads as
it comes, with a warning, and decodes a batch one prompt per call. The folders are written with the
onnx helpers from tiny checkpoints (models/tool_layouts.py); the cache lives under a temporary HOME."""
import json
import warnings

import pytest
from click.testing import CliRunner

from helpers_cli import split_runner
from helpers_convert import TINY
from models.hf_checkpoint import write_checkpoint
from models.tool_layouts import builder_export, builder_folder
from specsample_cupy.convert import convert
from test_convert_decode import PROMPTS, converted_self_pair

ARGS = dict(max_new_tokens=10, gamma=3, method="greedy", temperature=0, ignore_eos=True)


@pytest.fixture
def folders(tmp_path, monkeypatch):
    """(builder folder, the same checkpoint converted directly), the cache under tmp_path/home."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    hf = write_checkpoint(tmp_path / "hf", {**TINY["qwen2-tied"], "num_hidden_layers": 2}, dtype="float32", seed=4,
                          embed_scale=0.5)
    return builder_export(hf, tmp_path / "builder"), convert(hf, tmp_path / "direct", dtype="float32")


def test_a_builder_folder_opened_for_batches_decodes_a_batch_in_one_call(tmp_path, folders, capfd):
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    builder, direct = folders
    decoder = SpeculativeDecoder(builder, builder, device="cpu", batch_layout=True)
    assert "converted once into" in capfd.readouterr().err   # said once, for the target (the draft is the same)
    cache = tmp_path / "home" / ".cache" / "specsample" / "converted"
    assert decoder.target_spec.model_dir.parent == cache and decoder.draft_spec.model_dir.parent == cache
    out = decoder.generate(PROMPTS, **ARGS)
    assert not out.stats.get("one_prompt_at_a_time")
    assert out.token_ids == SpeculativeDecoder(direct, direct, device="cpu").generate(PROMPTS, **ARGS).token_ids
    SpeculativeDecoder(builder, builder, device="cpu", batch_layout=True)
    assert capfd.readouterr().err == ""   # the cached conversion is reused


def test_a_folder_the_converter_refuses_decodes_as_it_comes_with_a_warning(tmp_path, monkeypatch):
    """The project's GroupQueryAttention graph laid out as the builder lays its folders out runs, but
    its tensors are not under the builder's names, so the converter refuses it."""
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    target, draft = converted_self_pair(tmp_path, "float32", attention="gqa")
    target, draft = builder_folder(target, tmp_path / "bt"), builder_folder(draft, tmp_path / "bd")
    with pytest.warns(RuntimeWarning, match="its conversion for batches failed .*lacks the tensor") as seen:
        decoder = SpeculativeDecoder(target, draft, device="cpu", batch_layout=True)
    assert all("\n" not in str(w.message) for w in seen)
    assert decoder.target_spec.model_dir == target
    out = decoder.generate(PROMPTS, **ARGS)
    assert out.stats["one_prompt_at_a_time"]
    assert out.token_ids == [decoder.generate([p], **ARGS).token_ids[0] for p in PROMPTS]


def test_the_cli_loader_lets_the_refusal_through(tmp_path, monkeypatch):
    """load_decoder (every CLI command's) hides only the CPU-fallback warning, not why a folder opened
    for batches decodes prompt by prompt."""
    from specsample_cupy.cli.decode import load_decoder
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    target, draft = converted_self_pair(tmp_path, "float32", attention="gqa")
    target = builder_folder(target, tmp_path / "bt")
    with pytest.warns(RuntimeWarning, match="its conversion for batches failed"):
        load_decoder(target, target, "cpu", batch_layout=True)


def test_other_folders_open_as_they_are(tmp_path, folders):
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    _, direct = folders
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        decoder = SpeculativeDecoder(direct, direct, device="cpu", batch_layout=True)
    assert decoder.target_spec.model_dir == direct and not (tmp_path / "home").exists()


def test_the_cli_converts_a_builder_folder_for_several_prompts(tmp_path, folders):
    """`specsample decode` with two prompts and `specsample generate` batch a builder folder (generate's
    continuous batching refuses a folder that decodes one prompt per call)."""
    from cli import main
    builder, direct = folders
    models = ["--target", str(builder), "--draft", str(builder), "--device", "cpu"]
    res = split_runner().invoke(main, ["decode", *models, "--prompt", PROMPTS[0], "--prompt", PROMPTS[1], "--json",
                                       "--gamma", "3", "--method", "greedy", "--max-new-tokens", "6"])
    assert res.exit_code == 0, res.stderr
    assert "converted once into" in res.stderr
    printed = json.loads(res.stdout)
    assert len(printed["token_ids"]) == 2 and not printed["stats"].get("one_prompt_at_a_time")
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({"id": str(i), "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    res = CliRunner().invoke(main, ["generate", "--input", str(src), "--output", str(dst), *models, "--no-progress",
                                    "--max-new-tokens", "6", "--batch-size", "2", "--temperature", "0"])
    assert res.exit_code == 0, res.output
    lines = {json.loads(x)["id"]: json.loads(x) for x in dst.read_text().splitlines()}
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    expected = SpeculativeDecoder(direct, direct, device="cpu").generate(
        PROMPTS, max_new_tokens=6, method="greedy", temperature=0)
    assert [lines[str(i)]["token_ids"] for i in range(len(PROMPTS))] == expected.token_ids
    assert all(lines[str(i)]["finish_reason"] in ("length", "eos") for i in range(len(PROMPTS)))
