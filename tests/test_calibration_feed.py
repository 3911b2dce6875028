"""The feed the device loop's cost calibration replays its captured graphs on (device_cost.calibration_feed).
A GroupQueryAttention model over a shared buffer writes each run's new columns at the row's count (the
mask's sum): the calibration's feed must put them at the buffer's end, past the tokens the call holds,
which the replays then leave as they were. Checked on the CPU with the converted layout itself (its
present is the past with the new columns written in)."""
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort

from helpers_convert import TINY
from models.hf_checkpoint import write_checkpoint
from specsample_cupy.convert import convert
from specsample_cupy.decode.device_cost import calibration_feed

B, C, S = 1, 24, 3


def _step():
    feed = np.full(2 * B * S + B * (C + S), 7, np.int64)
    return SimpleNamespace(feed=feed, ids=feed[:B * S].reshape(B, S), steps=S)


def test_masked_layout_replays_on_zeros():
    step = _step()
    calibration_feed(SimpleNamespace(shared_buffer=False), step)
    assert not step.feed.any()


def test_shared_buffer_replays_write_past_the_calls_tokens(tmp_path):
    hf = write_checkpoint(tmp_path / "hf", {**TINY["qwen2-tied"], "num_hidden_layers": 1}, seed=3)
    folder = convert(hf, tmp_path / "gqa", dtype="float32", attention="gqa")
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    step = _step()
    calibration_feed(SimpleNamespace(shared_buffer=True, spec=SimpleNamespace(context_length=512)), step)
    mask = step.feed[2 * B * S:].reshape(B, C + S)
    assert mask.sum() == C and not step.ids.any()
    rng = np.random.default_rng(0)
    past = {i.name: rng.standard_normal((B, i.shape[1], C, i.shape[3])).astype(np.float32)
            for i in session.get_inputs() if i.name.startswith("past_key_values.")}
    outs = session.run(None, {"input_ids": step.ids, "attention_mask": mask,
                              "total_sequence_length": np.array([C], np.int32), **past})
    names = [o.name for o in session.get_outputs()]
    for name, present in zip(names[1:], outs[1:]):
        before = past[name.replace("present", "past_key_values")]
        np.testing.assert_array_equal(present[:, :, :C - S], before[:, :, :C - S])   # the call's slots kept
        assert not np.array_equal(present[:, :, C - S:], before[:, :, C - S:])       # the replay's columns
