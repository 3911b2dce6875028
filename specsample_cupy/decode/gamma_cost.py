"""What a round of gamma drafts costs, learnt from the round times a loop reads (the host loop's cost
model; the device loop's, calibrated by replaying its graphs, is in decode/device_loop.py). Used by
gamma_policy.AutoGamma."""
from __future__ import annotations

import numpy as np

COST_SAMPLES = 8       # round times LineCost keeps per gamma
JUMP = 0.25            # a timed gamma this far over LineCost's line is a slower path (LineCost)


class LineCost:
    """cost(gamma) from the round times read: a line a + b * gamma fitted by least squares to each
    timed gamma's lower median of its latest COST_SAMPLES rounds (a slow outlier, such as a process's
    first run of a shape, stops counting once that gamma is timed again), weighted by their count;
    before two gammas are timed, b = a * prior_ratio. A line smooths the noise of each gamma's few
    rounds (costs taken one gamma at a time make the argmax chase whichever happened to run fast);
    but a timed gamma over the line of the timed gammas below it by more than JUMP is a slower path
    (a model that slows down past some number of new tokens), which a line alone underprices and
    keeps choosing: it stays out of the fit, costs its own time, and every gamma past it the line
    times that ratio (an untimed gamma below it stays on the line, so it gets tried: a jump is
    found, not assumed). cost(0) is only a guess at a target step (measures_step: AutoGamma times
    one)."""

    measures_step = True

    def __init__(self, prior_ratio: float = 0.3, jump: float | None = JUMP):
        self.ratio = prior_ratio
        self.jump = jump      # None: no slower paths (a remainder whose noise is of its own size)
        self.samples = {}     # gamma -> its latest round times (COST_SAMPLES at most)
        self._medians = {}    # gamma -> the lower median of its samples
        self._fit = None      # line()'s answer until a gamma's median changes ...
        self._costs = {}      # ... and __call__'s, per gammas asked

    @property
    def fitted(self) -> bool:
        """Whether any round was timed (before that the costs are the prior's shape in no unit)."""
        return bool(self.samples)

    @property
    def settled(self) -> bool:
        """Whether some gamma was timed twice (its first time may be a process's first run: slow)."""
        return any(len(times) > 1 for times in self.samples.values())

    def observe(self, gamma: int, seconds: float):
        times = self.samples.setdefault(int(gamma), [])
        times.append(float(seconds))
        del times[:-COST_SAMPLES]
        median = sorted(times)[(len(times) - 1) // 2]
        if self._medians.get(int(gamma)) != median:   # else the fit stands (the policy asks every round)
            self._medians[int(gamma)] = median
            self._fit, self._costs = None, {}

    def state(self) -> tuple:
        """(rounds timed, {gamma: times}): what a later call of the kind starts from."""
        return (sum(map(len, self.samples.values())), {g: list(t) for g, t in self.samples.items()})

    def load(self, state: tuple) -> None:
        self.samples = {g: list(t) for g, t in state[1].items()}
        self._medians = {g: sorted(t)[(len(t) - 1) // 2] for g, t in self.samples.items()}
        self._fit, self._costs = None, {}

    def line(self) -> tuple[float, float, list]:
        """(a, b, [(gamma, ratio)] of the timed gammas over the line by more than JUMP). The timed
        gammas join the fit from the lowest up; one over the line of those below it does not."""
        if self._fit is None:
            self._fit = self._line()
        return self._fit

    def _line(self) -> tuple[float, float, list]:
        if not self._medians:
            return 1.0, self.ratio, []
        k = w = sx = sy = sxx = sxy = 0.0   # k: gammas in the fit; each weighs as many rounds as it kept
        a = b = 0.0
        jumps = []
        for x, y in sorted(self._medians.items()):
            if self.jump is not None and k >= 2 and a + b * x > 0 and y > (1.0 + self.jump) * (a + b * x):
                jumps.append((x, y))
                continue
            n = len(self.samples[x])
            k, w, sx, sy, sxx, sxy = k + 1, w + n, sx + n * x, sy + n * y, sxx + n * x * x, sxy + n * x * y
            if k == 1:
                a = y / (1.0 + self.ratio * x)   # one gamma timed: the prior's shape
                b = a * self.ratio
            else:
                b = max((w * sxy - sx * sy) / (w * sxx - sx * sx), 0.0)
                a = (sy - b * sx) / w
        return a, b, [(x, y / (a + b * x)) for x, y in jumps if a + b * x > 0]

    def __call__(self, gamma: np.ndarray) -> np.ndarray:
        g = np.asarray(gamma, np.float64)
        key = g.tobytes()
        cost = self._costs.get(key)
        if cost is None:
            a, b, jumps = self.line()
            cost = a + b * g
            for x, r in jumps:
                cost = np.where(g >= x, np.maximum(cost, (a + b * g) * r), cost)
            self._costs[key] = cost
        return cost.copy()
