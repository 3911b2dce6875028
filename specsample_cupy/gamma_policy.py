"""How many drafts each round proposes: fixed, Hugging Face's heuristic, or chosen from measurements.

A loop asks `next_gamma()` before it enqueues a round and tells the policy what each round it has
read did with `observe(round, seconds)`. The device loop reads rounds one or two behind the one it
enqueues, so its choices lag the newest measurements by that much; nothing waits for them.

AutoGamma maximises the rate at which the batch finishes. With a per-draft acceptance probability
alpha (drafts are accepted while they keep being accepted, so the accepted count is truncated
geometric), a round of gamma drafts emits on average

    E(gamma) = (1 - alpha^(gamma + 1)) / (1 - alpha)   tokens per request,

and costs cost(gamma) seconds. A generate() call returns when its last request is done (finished
rows are not replaced), so what matters is the slowest live request: the policy takes
argmax over [gamma_min, gamma_max] of min_b E_b(gamma) / cost(gamma), one alpha per request. (The
mean over requests would be a throughput for rows that are refilled; it favours long rounds that
the rows accepting least pay for, e.g. gamma 10 where 4 finishes a greedy batch of four sooner.)
alpha is estimated from the call's rounds read so far (successes / trials of the truncated geometric,
with a weak prior and exponential forgetting per round); cost comes from the loop: the device loop's
per-run costs measured by replaying its captured graphs plus the per-round remainder it observes, the
host loop a straight line a + b * gamma fitted to the rounds' wall times.

Each call's acceptance starts from the prior, not from the previous call's last estimate: a call's
first rounds accept less than the end of the call before it (greedy decoding of code: a few early
rejections, then drafts that agree for a hundred tokens), and a call that started where the last one
ended opened with long rounds that its first tokens rejected. On equal-work replays of the embedded
pair's greedy acceptance with the H200 costs of the three pairs (`benchmarks/auto_gamma_sim.py`),
starting from the last estimate with forgetting 0.95 reached 0.92-1.00 of the best fixed gamma; from
the prior (worth one draft) with forgetting 0.8, 0.99-1.07.

How fast old rounds are forgotten depends on how the tokens are chosen. Greedy decoding accepts in
runs (the draft's greedy continuation agrees with the target's for a stretch, then not), so the last
few rounds say most about the next: FORGET_GREEDY. Sampled acceptance varies less with the stretch of
text and more with the draws, and a round holds a few trials: a short memory then chases noise, so
sampling keeps FORGET_SAMPLED. Replayed exact sampling at T = 1, B = 1, 40 seeds (auto_gamma_sim.py
--method exact): with the 7B-cost pair's costs 0.94 of the best fixed gamma at forgetting 0.8 (the
H200 measured 0.92 over 15 seeds), 0.975 at 0.9, 0.967 at 0.95; with the 1.5B-cost pair's, 0.95 at 0.8
and 0.99 at 0.9 or 0.95. Greedy replays at 0.95 fell to 0.94-1.00 (0.99-1.07 at 0.8).

Exact sampling can do better than count: a draft sampled from q is accepted with probability
beta = sum_x min(p(x), q(x)) (one minus the total variation distance of the two rows), which the
loop computes from the logits it verified (expected_acceptance(); on the device loop
kernels_cu/expected_accept.cu). Counting beta in place of each accepted draft (its conditional
mean given the positions tried) keeps the estimate unbiased and removes the draws' noise, so a
longer memory (FORGET_EXPECTED) follows the text rather than the draws. Replayed as above (40 seeds,
T = 1, B = 1, 7B-cost costs): 0.975 of the best fixed gamma counting accepted drafts at forgetting
0.9, 0.986 / 0.992 / 0.988 from beta at 0.9 / 0.95 / 0.98; the chosen gamma's spread (standard
deviation over rounds) fell from 1.4 to 0.6.

What a call learns of the costs is kept for the next call of the same kind (state() / load(): the
decoder keeps it per method, temperature and batch size), and so is its verdict on speculation: when
the call's pooled acceptance (all its rounds, no forgetting) and the costs say a target-only step
(gamma = 0: one token for one target run) yields more tokens per second than any round with drafts,
prefers_target_only() is true and the decoder runs its next calls of that kind target-only,
speculating again every REPROBE-th call to measure afresh.
"""
from __future__ import annotations

import numpy as np

FORGET_GREEDY = 0.8    # weight of older acceptance observations per round read: greedy decoding ...
FORGET_SAMPLED = 0.9   # ... and sampling (module docstring)
FORGET_EXPECTED = 0.95  # ... and exact sampling that observes expected acceptance (module docstring)
COST_FORGET = 0.95     # the same for the round times LineCost fits
REPROBE = 8            # calls of a kind that prefers target-only: every REPROBE-th speculates again
PRIOR_ALPHA = 0.6      # acceptance assumed before any round is read ...
PRIOR_TRIALS = 1.0     # ... worth this many drafts


def expected_tokens(alpha: float, gamma: np.ndarray) -> np.ndarray:
    """Mean tokens a request emits in a round of `gamma` drafts at acceptance probability alpha."""
    gamma = np.asarray(gamma, np.float64)
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1.0)) / (1.0 - alpha)


def expected_acceptance(xp, draft_logits, target_logits, temperature, draft_len) -> np.ndarray:
    """[B, g] float64 on the host: beta[b, i] = sum_x min(p(x), q(x)), p = softmax(target_logits[b, i] / T),
    q = softmax(draft_logits[b, i] / T) (T: a scalar > 0 or [B]), the probability that exact
    verification accepts draft i of request b sampled from q, given that it reaches it; 0 at positions
    i >= draft_len[b]. draft_logits [B, g, V] and target_logits [B, >= g, V] of module xp (any float
    dtype; computed in float64 on NumPy, float32 on CuPy). The reference of expected_accept.cu."""
    B, g = draft_logits.shape[:2]
    dtype = np.float64 if xp is np else np.float32
    t = xp.asarray(temperature, dtype).reshape(-1, 1, 1)

    def softmax(z):
        z = z.astype(dtype) / t
        e = xp.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    beta = xp.minimum(softmax(target_logits[:, :g]), softmax(draft_logits)).sum(axis=-1)
    beta = beta.get() if hasattr(beta, "get") else beta
    return np.where(np.arange(g)[None, :] < np.asarray(draft_len).reshape(B, 1), beta.astype(np.float64), 0.0)


def positions_tried(accepted, draft_len):
    """How many draft positions verification reached: the accepted ones and the first rejection, or all
    draft_len when every draft was accepted (a rejection ends a row's successes and is a trial). Ints
    or integer arrays alike."""
    return accepted + (accepted < draft_len)


def expected_accepted(beta: np.ndarray, draft_len: np.ndarray, accepted: np.ndarray) -> np.ndarray:
    """[B] the expected count of accepted drafts at the positions each request tried (positions_tried):
    beta summed over them, AutoGamma's success count in place of `accepted`."""
    tried = positions_tried(np.asarray(accepted), np.asarray(draft_len))
    return np.where(np.arange(beta.shape[1])[None, :] < tried[:, None], beta, 0.0).sum(axis=1)


class FixedGamma:
    expected = False   # whether the loop reports Round.expected_accepted (AutoGamma for exact sampling)

    def __init__(self, gamma: int):
        self.gamma = self.cap = int(gamma)

    def next_gamma(self) -> int:
        return self.gamma

    def observe(self, rnd, seconds: float | None = None) -> None:
        pass


class HeuristicGamma(FixedGamma):
    """Hugging Face's rule: gamma + 2 after a round where every request accepted all its drafts, else
    gamma - 1, within [gamma_min, gamma_max]."""

    def __init__(self, gamma: int, gamma_min: int, gamma_max: int):
        self.gamma, self.lo, self.cap = int(np.clip(gamma, gamma_min, gamma_max)), gamma_min, gamma_max

    def observe(self, rnd, seconds=None):
        proposing = rnd.active & (rnd.draft_len > 0)
        if proposing.any():
            all_in = bool((rnd.accepted[proposing] >= rnd.draft_len[proposing]).all())
            self.gamma = int(np.clip(self.gamma + (2 if all_in else -1), self.lo, self.cap))


class LineCost:
    """cost(gamma) = a + b * gamma, fitted by weighted least squares to (gamma, seconds) of the rounds
    read, with older rounds forgotten; before two distinct gammas are seen, b = a * prior_ratio."""

    def __init__(self, prior_ratio: float = 0.3):
        self.ratio = prior_ratio
        self.w = self.wx = self.wy = self.wxx = self.wxy = 0.0

    def observe(self, gamma: int, seconds: float):
        f = COST_FORGET
        self.w, self.wx, self.wy = f * self.w + 1, f * self.wx + gamma, f * self.wy + seconds
        self.wxx, self.wxy = f * self.wxx + gamma * gamma, f * self.wxy + gamma * seconds

    def state(self) -> tuple:
        return (self.w, self.wx, self.wy, self.wxx, self.wxy)

    def load(self, state: tuple) -> None:
        self.w, self.wx, self.wy, self.wxx, self.wxy = state

    def line(self) -> tuple[float, float]:
        """(a, b) of the fit so far (Python floats: the policy asks after every round)."""
        if self.w == 0:
            return 1.0, self.ratio
        mx, my = self.wx / self.w, self.wy / self.w
        var = self.wxx / self.w - mx * mx
        if var > 1e-9:
            b = (self.wxy / self.w - mx * my) / var
            a = my - b * mx
            if a > 0 and b > 0:
                return a, b
        a = my / (1 + self.ratio * mx)           # one gamma seen so far: keep the prior's shape
        return a, a * self.ratio

    def __call__(self, gamma: np.ndarray) -> np.ndarray:
        a, b = self.line()
        return a + b * np.asarray(gamma, np.float64)


class AutoGamma(FixedGamma):
    """argmax over gamma of the slowest live request's expected tokens per second (module docstring),
    with one acceptance estimate per request.

    cost: callable gamma [k] -> seconds [k] per round, with `observe(gamma, seconds)` to learn from
    the rounds read (LineCost, or the device loop's calibrated cost). forget: the weight of older
    acceptance observations per round (forgetting(temperature))."""

    def __init__(self, gamma: int, gamma_min: int, gamma_max: int, cost, forget: float = FORGET_GREEDY,
                 expected: bool = False):
        self.gamma, self.lo, self.cap, self.cost = int(np.clip(gamma, gamma_min, gamma_max)), gamma_min, gamma_max, cost
        self.forget = float(forget)
        self.expected = bool(expected)   # count the rounds' expected acceptance (Round.expected_accepted)
        self.gammas = np.arange(gamma_min, gamma_max + 1)   # the choices
        # Per request, as Python lists: B is small where the host sets the pace, and a dozen NumPy
        # calls on [B] arrays per round cost more than the loop over rows.
        self.successes = self.trials = None   # [B] forgotten counts, sized by the first round observed
        self.live = None        # [B] bool: unfinished in the last round observed
        self.pooled = None      # [successes, trials]: every round of the call, not forgotten
        self.measured = False   # whether any round has been observed

    @property
    def alpha(self) -> np.ndarray:
        """Each request's acceptance estimate [B] (the prior before any round)."""
        if self.successes is None:
            return np.array([PRIOR_ALPHA])
        return np.divide(self.successes, self.trials)

    def observe(self, rnd, seconds=None):
        active = rnd.active.tolist()
        B = len(active)
        if self.successes is None or len(self.successes) != B:
            self.successes, self.trials = [PRIOR_ALPHA * PRIOR_TRIALS] * B, [PRIOR_TRIALS] * B
            self.pooled = [list(self.successes), list(self.trials)]
        s, t, ps, pt, f = self.successes, self.trials, self.pooled[0], self.pooled[1], self.forget
        counts = rnd.accepted.tolist() if rnd.expected_accepted is None else rnd.expected_accepted.tolist()
        for b, (live, drafts, acc, n) in enumerate(zip(active, rnd.draft_len.tolist(), rnd.accepted.tolist(), counts)):
            if live and drafts > 0:
                tried = positions_tried(acc, drafts)
                s[b] = f * s[b] + n
                t[b] = f * t[b] + tried
                ps[b] += n
                pt[b] += tried
                self.measured = True
        self.live = active
        if seconds is not None and seconds > 0:
            self.cost.observe(rnd.gamma, seconds)
        self.choose()

    def _slowest_alpha(self, alpha=None) -> float:
        """The least acceptance among the live requests (all when none is live; `alpha` [B], default
        the current estimates): E(gamma) grows with alpha for every gamma, so that request has the
        fewest expected tokens whatever gamma is."""
        if alpha is None:
            if self.successes is None:
                return PRIOR_ALPHA
            alpha = [x / y for x, y in zip(self.successes, self.trials)]
        else:
            alpha = np.asarray(alpha, np.float64).tolist()
        live = self.live if self.live is not None and len(self.live) == len(alpha) and any(self.live) else None
        return min(min(a for a, keep in zip(alpha, live) if keep) if live else min(alpha), 0.999)

    def _rates(self, gammas, alpha=None) -> np.ndarray:
        """Expected tokens per second of the slowest live request for each of `gammas` (alpha [B]:
        default the current estimates)."""
        return expected_tokens(self._slowest_alpha(alpha), gammas) / self.cost(gammas)

    def choose(self) -> None:
        """Set gamma to the best of [gamma_min, gamma_max] under the current estimates (the first best,
        as np.argmax of _rates). Runs after every round the loop reads, on the host, where a launch-bound
        pair's rounds wait for it: one acceptance (the slowest request's), E(gamma) summed term by term
        in Python floats (a dozen NumPy calls on 12-element arrays took ~30 µs)."""
        a = self._slowest_alpha()
        costs = self.cost(self.gammas).tolist()
        term = a ** self.lo
        tokens = (1.0 - term * a) / (1.0 - a)      # E(gamma_min)
        best, best_rate = self.lo, tokens / costs[0]
        for g, c in zip(range(self.lo + 1, self.cap + 1), costs[1:]):
            term *= a
            tokens += term                          # E(g) = E(g - 1) + a^g
            if tokens / c > best_rate:
                best, best_rate = g, tokens / c
        self.gamma = best

    def prefers_target_only(self) -> bool:
        """Whether a target-only step (gamma = 0) beats every gamma in range, by the call's pooled
        acceptance (every round it read, not forgotten) and the measured costs."""
        if not self.measured:
            return False
        alpha = np.divide(self.pooled[0], self.pooled[1])
        return bool(self._rates(np.array([0]), alpha)[0] > self._rates(self.gammas, alpha).max())

    def state(self) -> dict:
        """What the next call of the same kind starts from: the costs (its acceptance starts from the
        prior: module docstring)."""
        return {"cost": self.cost.state()}

    def load(self, state: dict) -> None:
        self.cost.load(state["cost"])   # the caller calls choose() once the cost can be evaluated


def forgetting(temperature: float, expected: bool = False) -> float:
    """AutoGamma's forgetting for decoding at this temperature (0: greedy), counting expected acceptance
    or accepted drafts (module docstring)."""
    return FORGET_GREEDY if temperature == 0 else (FORGET_EXPECTED if expected else FORGET_SAMPLED)


def make_policy(gamma: int, mode: str, gamma_min: int, gamma_max: int, cost=None, temperature: float = 0.0,
                expected: bool = False):
    """mode: "fixed", "adaptive" (HeuristicGamma) or "auto" (AutoGamma with `cost`, LineCost if None,
    forgetting as suits `temperature`). expected: the loop can report each round's expected acceptance
    (exact sampling at temperature > 0 with a draft model, no truncation), which "auto" then counts."""
    if mode == "fixed" or gamma == 0:
        return FixedGamma(gamma)
    if not 1 <= gamma_min <= gamma_max:
        raise ValueError(f"need 1 <= gamma_min <= gamma_max, got {gamma_min}, {gamma_max}")
    if mode == "adaptive":
        return HeuristicGamma(gamma, gamma_min, gamma_max)
    if mode == "auto":
        expected = bool(expected and temperature > 0)
        return AutoGamma(gamma, gamma_min, gamma_max, cost if cost is not None else LineCost(),
                         forgetting(temperature, expected), expected)
    raise ValueError(f"gamma mode must be 'fixed', 'adaptive' or 'auto', got {mode!r}")
