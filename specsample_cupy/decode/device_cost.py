"""Automatic gamma's cost model on the device loop: each gamma's model time measured by replaying the
captured graphs (calibrate_model_costs), plus a remainder fitted from the rounds' times (DeviceCost)."""
from __future__ import annotations

import numpy as np


class DeviceCost:
    """AutoGamma's cost of a device round of gamma drafts: the model runs' GPU time measured by replaying
    the captured graphs (calibrate_model_costs), plus what the rounds read so far took beyond it
    (kernels, verify(), idle gaps; a gamma_policy.LineCost of those remainders), 0 before any round
    is read. cost(0) is the target's S = 1 run plus that remainder's guess, not a target step's own
    (target_step_done, no verify()): AutoGamma times a target step (measures_step)."""

    measures_step = True

    def __init__(self, model_s: dict):
        from specsample_cupy.decode.gamma_policy import LineCost
        self.model_s = model_s
        self.rest = LineCost(prior_ratio=0.05, jump=None)   # the models' slower paths are in model_s

    @property
    def model_s(self):
        """{gamma: model seconds of a round}, or None before calibration."""
        return self._model_s

    @model_s.setter
    def model_s(self, value):
        self._model_s = value
        self._model = {}   # gammas (dtype, bytes) -> (model seconds, gammas as floats): asked after every round

    @property
    def fitted(self) -> bool:
        """Whether the model costs are calibrated (the rest is 0 until rounds are read)."""
        return self.model_s is not None

    settled = fitted   # replays of captured graphs: no slow first run to wait out

    def observe(self, gamma: int, seconds: float):
        self.rest.observe(gamma, seconds - self.model_s[gamma])

    def state(self):
        return self.rest.state()

    def load(self, state):
        self.rest.load(state)

    def __call__(self, gammas):
        key = (gammas.dtype.str, gammas.tobytes()) if isinstance(gammas, np.ndarray) else tuple(gammas)
        known = self._model.get(key)
        if known is None:
            g = np.asarray(gammas)
            known = self._model[key] = (np.array([self.model_s[int(x)] for x in g.tolist()]), g.astype(np.float64))
        model, g = known
        return model + np.maximum(self.rest(g), 0.0) if self.rest.fitted else model


def calibration_feed(session, step) -> None:
    """The feed the calibration replays run on: zeros (every id in range, no slot seen), except that a
    model writing into a shared buffer (GroupQueryAttention: a run's columns land at the row's count,
    the mask's sum) is shown a full cache, so that its replays write at the buffer's end, past every
    token the call holds, which runs write before they read. A zero count would place the columns
    before the row's start, over other rows' keys and values."""
    step.feed.fill(0)
    if not getattr(session, "shared_buffer", False):
        return
    B, S = step.ids.shape
    mask = step.feed[2 * B * S:].reshape(B, -1)
    C = mask.shape[1] - S
    total = min(C, session.spec.context_length or C)   # the bound total_sequence_length
    mask[:, :total - S] = 1
    mask[:, C:] = 1


def calibrate_model_costs(decoder, buf, gammas, replays: int = 5) -> dict:
    """buf: the call's round_buffers._RoundBuffers. GPU seconds of a round's model runs for each gamma (the draft's S = 2 run, gamma - 1 S = 1 runs,
    the target's S = gamma + 1 run; gamma = 0: a target-only step's S = 1 run), from replays of each
    captured graph between CUDA events. Runs before a call's first round writes any feed (the feeds
    are written first: calibration_feed), and kept per plan by the decoder."""
    import cupy
    key = (buf.plans, tuple(gammas))
    kept = decoder._model_costs.get(key)
    if kept is not None:
        return kept
    stream = decoder.stream
    runs = {}
    if decoder.draft is not None:   # prompt lookup: no draft runs (its kernel is in the remainder)
        runs[("draft", 2)] = (decoder.draft, buf.draft_steps[0])
        if len(buf.draft_steps) > 1:
            runs[("draft", 1)] = (decoder.draft, buf.draft_steps[1])
    for g in [0, *gammas]:
        runs[("target", g + 1)] = (decoder.target, buf.target_step(decoder.target, g + 1))
    seconds = {}
    with stream:
        for key_run, (session, step) in runs.items():
            calibration_feed(session, step)
            session.replay(step)   # the first replay captures the graph
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            for _ in range(replays):
                session.replay(step)
            end.record(stream)
            end.synchronize()
            seconds[key_run] = cupy.cuda.get_elapsed_time(start, end) / 1e3 / replays
    costs = {g: seconds.get(("draft", 2), 0.0) + (g - 1) * seconds.get(("draft", 1), 0.0) + seconds[("target", g + 1)]
             for g in gammas}
    costs[0] = seconds[("target", 1)]
    decoder._model_costs[key] = costs
    return costs
