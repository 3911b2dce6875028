"""How many drafts each round proposes: fixed, Hugging Face's heuristic, or chosen from measurements.

A loop asks `next_gamma()` before it enqueues a round and tells the policy what each round it has
read did with `observe(round, seconds, ran)` (ran: the gamma its runs had, where fewer drafts ran).
gamma = 0 is a target step: one target run, one token per request. The device loop reads rounds one
or two behind the one it enqueues, so its choices lag the newest measurements by that much; nothing
waits for them.

AutoGamma maximises the rate at which the batch finishes. With a per-draft acceptance probability
alpha (drafts are accepted while they keep being accepted, so the accepted count is truncated
geometric), a round of gamma drafts emits on average

    E(gamma) = (1 - alpha^(gamma + 1)) / (1 - alpha)   tokens per request   (E(0) = 1),

and costs cost(gamma) seconds. A generate() call returns when its last request is done, so the
policy takes argmax over gamma of min_b E_b(gamma) / cost(gamma), one alpha per request (the mean
over requests favours long rounds that the rows accepting least pay for). alpha: the call's rounds
read so far (successes / trials of the truncated geometric, a weak prior, exponential forgetting per
round: FORGET_GREEDY, as greedy acceptance comes in runs; FORGET_SAMPLED, as a short memory chases
the draws' noise; FORGET_EXPECTED where the loop counts each draft's acceptance probability
sum_x min(p(x), q(x)) instead of the draw). cost: from the loop (device_cost.DeviceCost: each gamma's
model time by replaying its captured graphs plus a fitted remainder; gamma_cost.LineCost: the host
loop's round times). Each call's acceptance starts from the prior: a call's first rounds accept less
than the end of the call before.

Never slower than target-only decoding beyond a bound: a call stops drafting and decodes with target
steps to its end when every gamma costs more than the gamma + 1 target steps it could replace
("costs"), when its slowest live request's pooled acceptance over VERDICT_TRIALS drafts says target
steps win ("acceptance"), or when its regret (its timed drafting rounds' seconds, a host's stall
capped at STALL x (gamma + 1) target steps, minus the step cost times the tokens the mean live
request took in them) plus the likely loss of the rounds in flight would pass LOSS_BUDGET of the call's
target-only time plus its credit ("budget"). A call opens with target steps while fewer than the loop's
probe_steps were timed, and drafts gamma_min while no gamma is timed twice. What a call learns (costs,
timed steps, credit, and whether the kind prefers target-only) is kept for the next call of the same
kind (state() / load()). The rule, its bounds and why each piece is there: docs/decode-loop.md
("Automatic γ"); the measurements: docs/performance.md.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from specsample_cupy.decode.acceptance import expected_tokens, positions_tried
from specsample_cupy.decode.gamma_cost import LineCost

FORGET_GREEDY = 0.8    # weight of older acceptance observations per round read: greedy decoding ...
FORGET_SAMPLED = 0.9   # ... and sampling (module docstring)
FORGET_EXPECTED = 0.95  # ... and exact sampling that observes expected acceptance (module docstring)
REPROBE = 8            # calls of a kind that prefers target-only: every REPROBE-th speculates again
PRIOR_ALPHA = 0.6      # acceptance assumed before any round is read ...
PRIOR_TRIALS = 1.0     # ... worth this many drafts
DOUBT = 2.0            # drafts added to a request's pooled counts: rejected for a round's likely loss,
                       # accepted for the verdict on a kind (module docstring)
VERDICT_TRIALS = 24    # drafts the slowest request must have tried before its pooled estimate stops drafting
CREDIT_CAP = 6.0       # what earlier calls of a kind gained, carried to the next call: at most this many budgets
FIRST_CREDIT = 1.0     # budgets of credit a kind's first call starts with: to find out whether drafting pays
LOSS_BUDGET = 0.02     # of a call's target-only time: what its speculative rounds may lose to target steps
STALL = 2.0            # a drafting round past this many times gamma + 1 target steps counts as that (_counted())
HORIZON = 128          # tokens per request assumed when the loop does not say (begin())
STEP_SAMPLES = 8       # target step times kept; their lower median is the step cost


class FixedGamma:
    expected = False   # whether the loop reports Round.expected_accepted (AutoGamma for exact sampling)
    target_steps = False   # whether a gamma = 0 round may follow drafting rounds (AutoGamma)

    def __init__(self, gamma: int):
        self.gamma = self.cap = int(gamma)

    def next_gamma(self) -> int:
        return self.gamma

    def observe(self, rnd, seconds: float | None = None, ran: int | None = None) -> None:
        """Round `rnd` took `seconds` (None: not timed); ran: the gamma its runs had, when fewer drafts
        than rnd.gamma ran (the host loop runs only the longest proposal: a budget's end, prompt lookup)."""

    def begin(self, horizon: int, probe_steps: int = 1) -> None:
        """A loop's call starts (AutoGamma.begin())."""


class HeuristicGamma(FixedGamma):
    """Hugging Face's rule: gamma + 2 after a round where every request accepted all its drafts, else
    gamma - 1, within [gamma_min, gamma_max]."""

    def __init__(self, gamma: int, gamma_min: int, gamma_max: int):
        self.gamma, self.lo, self.cap = int(np.clip(gamma, gamma_min, gamma_max)), gamma_min, gamma_max

    def observe(self, rnd, seconds=None, ran=None):
        proposing = rnd.active & (rnd.draft_len > 0)
        if proposing.any():
            all_in = bool((rnd.accepted[proposing] >= rnd.draft_len[proposing]).all())
            self.gamma = int(np.clip(self.gamma + (2 if all_in else -1), self.lo, self.cap))


class AutoGamma(FixedGamma):
    """argmax over gamma of the slowest live request's expected tokens per second, target steps
    (gamma = 0) included, with one acceptance estimate per request (module docstring).

    cost: callable gamma [k] -> seconds [k] per round, with `observe(gamma, seconds)` to learn from
    the rounds read (LineCost, or the device loop's calibrated cost); `measures_step` true when its
    cost(0) is a guess that a timed target step should replace, `settled` false while its costs may
    still be a first run's. forget: the weight of older acceptance observations per round
    (forgetting())."""

    target_steps = True   # may hand out gamma = 0 after drafting rounds: the loops prepare target steps

    def __init__(self, gamma: int, gamma_min: int, gamma_max: int, cost, forget: float = FORGET_GREEDY,
                 expected: bool = False):
        self.gamma, self.lo, self.cap, self.cost = int(np.clip(gamma, gamma_min, gamma_max)), gamma_min, gamma_max, cost
        self.forget = float(forget)
        self.expected = bool(expected)   # count the rounds' expected acceptance (Round.expected_accepted)
        self.gammas = np.arange(gamma_min, gamma_max + 1)   # the drafting choices
        # Per request, as Python lists: B is small where the host sets the pace, and a dozen NumPy
        # calls on [B] arrays per round cost more than the loop over rows.
        self.successes = self.trials = None   # [B] forgotten counts, sized by the first round observed
        self.live = None        # [B] bool: unfinished in the last round observed
        self.pooled = None      # [successes, trials]: every round of the call, not forgotten
        self.measured = False   # whether any drafting round has been observed
        # Target steps (module docstring): their measured cost, and what bounds the call's loss to them.
        self.steps = []         # seconds of the latest timed target steps (STEP_SAMPLES at most)
        self.probe_steps = 1    # target steps a call opens with while fewer are timed (begin())
        self.handed = 0         # rounds handed out (next_gamma())
        self.stopped = False    # the call has stopped drafting: target steps to its end ...
        self.stopped_by = None  # ... because the "costs" or the "acceptance" said so, or the loss "budget" ran out
        self.horizon = HORIZON  # tokens per request the call may generate (begin())
        self.spent = 0.0        # seconds of the call's timed drafting rounds ...
        self.progress = None    # ... and [B] the tokens each request took in them
        self.credit = None      # target steps' worth that earlier calls of the kind gained (state()); None: the first
        self.pending = deque()  # gammas handed out and not yet observed (the device loop reads late)
        self._costs = None      # (cost of each of self.gammas, step cost): from the last choose()

    def begin(self, horizon: int, probe_steps: int = 1) -> None:
        """The loop's call generates at most `horizon` tokens per request (the loss budget's scale), and
        it may open with `probe_steps` target steps, which time one while fewer are known (the host
        loop 2: a process's first run of a shape is slow on ONNX Runtime; the device loop 1, its graphs
        replayed already and its draft able to catch up on one step only)."""
        self.horizon = max(int(horizon), 1)
        self.probe_steps = max(int(probe_steps), 1)

    @property
    def alpha(self) -> np.ndarray:
        """Each request's acceptance estimate [B] (the prior before any round)."""
        if self.successes is None:
            return np.array([PRIOR_ALPHA])
        return np.divide(self.successes, self.trials)

    def regret(self, step: float | None = None) -> float:
        """Seconds the call's timed drafting rounds took beyond target steps for the same tokens: the
        mean over live requests of what each took in them (the slowest request, whose early rejections
        greedy decoding usually makes up later, would stop calls that pay), at the step cost."""
        step = self.step_cost() if step is None else step
        taken = self._live(self.progress) if self.progress is not None else [0]
        return self.spent - step * sum(taken) / len(taken)

    def step_cost(self) -> float:
        """Seconds of a target step: the lower median of the latest timed ones (a slow outlier, such as a
        process's first run of a shape, does not count), else the cost model's guess at gamma = 0."""
        if self.steps:
            return sorted(self.steps)[(len(self.steps) - 1) // 2]
        return float(np.asarray(self.cost(np.array([0])), np.float64).reshape(-1)[0])

    def _costs_of(self, gammas) -> np.ndarray:
        """Seconds of a round of each of `gammas` (0: a target step, step_cost())."""
        gammas = np.asarray(gammas)
        return np.where(gammas == 0, self.step_cost(), np.asarray(self.cost(gammas), np.float64))

    def observe(self, rnd, seconds=None, ran=None):
        if self.pending:
            self.pending.popleft()
        active = rnd.active.tolist()
        B = len(active)
        if self.successes is None or len(self.successes) != B:
            self.successes, self.trials = [PRIOR_ALPHA * PRIOR_TRIALS] * B, [PRIOR_TRIALS] * B
            self.pooled = [list(self.successes), list(self.trials)]
            self.progress = [0] * B
        self.live = active
        timed = seconds is not None and seconds > 0
        if rnd.gamma == 0:   # a target step: its time is the step cost; it says nothing of acceptance
            if timed:
                self.steps = (self.steps + [float(seconds)])[-STEP_SAMPLES:]
            if not self.stopped:
                self.choose()
            return
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
        if timed:   # only timed rounds count in the regret: measured, not modelled
            self.cost.observe(rnd.gamma if ran is None else ran, seconds)
            self.spent += self._counted(rnd.gamma if ran is None else ran, seconds)
            for b, (live, n) in enumerate(zip(active, rnd.taken.tolist())):
                if live:
                    self.progress[b] += n
        self.choose()

    def _counted(self, gamma: int, seconds: float) -> float:
        """A drafting round's seconds as the regret counts them: at most STALL times gamma + 1 timed
        target steps, what the round's runs would cost were the draft as dear as the target. A round
        slower than that was stalled by its host (a CPU machine's scheduler: 4-16 ms on a 1 ms step),
        which target steps would have met as well; the cost model still sees the round's full time."""
        if not self.steps:
            return seconds
        return min(seconds, STALL * (gamma + 1) * self.step_cost())

    def _live(self, values: list) -> list:
        """values [B] of the live requests (all when none is live or nothing was observed)."""
        live = self.live
        if live is None or len(live) != len(values) or all(live) or not any(live):
            return values
        return [v for v, keep in zip(values, live) if keep]

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
        return min(min(self._live(alpha)), 0.999)

    def _doubtful_alpha(self) -> float:
        """What the loss budget expects a round to accept: the live requests' mean acceptance by the
        call's pooled counts with DOUBT more drafts rejected each (few rounds read leave room for doubt,
        many do not; the mean, as regret() counts the mean request's tokens, and E(gamma) at the mean
        acceptance is at most the requests' mean E(gamma))."""
        if self.pooled is None:
            return PRIOR_ALPHA * PRIOR_TRIALS / (PRIOR_TRIALS + DOUBT)
        alpha = self._live([x / (y + DOUBT) for x, y in zip(*self.pooled)])
        return min(sum(alpha) / len(alpha), 0.999)

    def _rates(self, gammas, alpha=None) -> np.ndarray:
        """Expected tokens per second of the slowest live request for each of `gammas` (0: a target
        step; alpha [B]: default the current estimates)."""
        return expected_tokens(self._slowest_alpha(alpha), gammas) / self._costs_of(gammas)

    def choose(self) -> None:
        """Set gamma to the best of [gamma_min, gamma_max] under the current estimates (the first best,
        as np.argmax of _rates), or stop drafting (gamma 0 to the call's end) when the costs say no
        gamma can pay (each costs more than the gamma + 1 target steps that emit as many tokens as
        it can at most), or the acceptance does (_verdict_alpha()). Runs after every round the loop
        reads, on the host, where a launch-bound pair's rounds wait for it: E(gamma) summed term by
        term in Python floats at the three acceptances it weighs (a dozen NumPy calls on 12-element
        arrays took ~30 µs)."""
        if self.stopped:
            self.gamma = 0
            return
        if not getattr(self.cost, "settled", True):   # no gamma timed twice: the cheapest probe first
            self.gamma, self._costs = self.lo, None
            return
        costs = np.asarray(self.cost(self.gammas), np.float64).tolist()
        step = self.step_cost()
        if all(c >= (g + 1) * step for g, c in zip(range(self.lo, self.cap + 1), costs)):
            self.stopped, self.stopped_by, self.gamma = True, "costs", 0
            return
        verdict = self._verdict_alpha(VERDICT_TRIALS)
        a, low, v = self._slowest_alpha(), self._doubtful_alpha(), 0.0 if verdict is None else verdict
        ta, tl, tv = a ** self.lo, low ** self.lo, v ** self.lo
        ea, el, ev = (1.0 - ta * a) / (1.0 - a), (1.0 - tl * low) / (1.0 - low), (1.0 - tv * v) / (1.0 - v)
        best, best_rate, best_verdict = self.lo, ea / costs[0], ev / costs[0]
        losses = [costs[0] - step * el]   # each gamma's likely loss to target steps (the budget's)
        for g, c in zip(range(self.lo + 1, self.cap + 1), costs[1:]):
            ta, tl, tv = ta * a, tl * low, tv * v
            ea, el, ev = ea + ta, el + tl, ev + tv   # E(g) = E(g - 1) + alpha^g, at each acceptance
            if ea / c > best_rate:
                best, best_rate = g, ea / c
            if ev / c > best_verdict:
                best_verdict = ev / c
            losses.append(c - step * el)
        if verdict is not None and best_verdict * step < 1.0:   # 1 / step: a target step's tokens per second
            self.stopped, self.stopped_by, self.gamma = True, "acceptance", 0
            return
        self._costs = (costs, step, losses)
        self.gamma = best

    def next_gamma(self) -> int:
        """The next round's gamma: the chosen one, or the largest below it that the loss budget
        affords (module docstring); 0 when none is (the call then stops drafting), and while a call
        opens with target steps that time one."""
        g = self._hand_out()
        self.handed += 1
        self.pending.append(g)
        return g

    def _hand_out(self) -> int:
        if self.stopped:
            return 0
        if self.handed < self.probe_steps and len(self.steps) < self.probe_steps and not any(self.pending) \
                and getattr(self.cost, "measures_step", False):
            return 0   # free: target-only decoding's own step, timed
        if self._costs is None:
            if not getattr(self.cost, "settled", True):
                return self.gamma   # the probe (choose(): gamma_min)
            self.choose()   # first hand-out without a choose() yet (costs known from the start)
            if self.stopped:
                return 0
        costs, step, losses = self._costs
        # What the call may still lose: its budget and the credit earlier calls of its kind earned,
        # less the regret of the rounds read (measured) and the likely loss of those in flight; always
        # enough for one gamma_min round that accepts nothing.
        allowance = max(step * (LOSS_BUDGET * self.horizon + self._credit()), costs[0] - step)
        room = allowance - self.regret(step) - sum(losses[p - self.lo] for p in self.pending if p > 0)
        # The round may also accept nothing (cost(gamma) - step lost): at most one budget past the room.
        slack = room + step * LOSS_BUDGET * self.horizon
        g = self.gamma
        while g >= self.lo and (losses[g - self.lo] > room or costs[g - self.lo] - step > slack):
            g -= 1
        if g < self.lo:
            self.stopped, self.stopped_by, self.gamma = True, "budget", 0
            return 0
        return g

    def _verdict_alpha(self, trials: float) -> float | None:
        """The slowest live request's pooled acceptance (every round the call read, not forgotten) with
        DOUBT more drafts accepted, or None before it has tried `trials` drafts (in a call: greedy
        decoding accepts in runs, and fewer may be a run of rejections that ends)."""
        if not self.measured or min(self._live(self.pooled[1])) < trials + PRIOR_TRIALS:
            return None
        return min(min(self._live([(x + DOUBT) / (y + DOUBT) for x, y in zip(*self.pooled)])), 0.999)

    def prefers_target_only(self) -> bool:
        """Whether the next calls of this kind should run target-only: the call stopped drafting because
        the costs or its acceptance said so, or by its end its acceptance (_verdict_alpha(), however
        few drafts it tried: a call stopped by its loss budget ends early) and the costs say a target
        step beats every gamma."""
        if self.stopped_by in ("costs", "acceptance"):
            return True
        alpha = self._verdict_alpha(0)
        if alpha is None:
            return False
        return bool(self._rates(np.array([0]), [alpha])[0] > self._rates(self.gammas, [alpha]).max())

    def state(self) -> dict:
        """What the next call of the same kind starts from (its acceptance starts from the prior: module
        docstring): the costs, the target step's included, and the credit: what this call gained
        against target steps and did not spend of its budget, added to what it started with (at most
        CREDIT_CAP budgets; unchanged by a call that drafted nothing)."""
        credit = self.credit or 0.0   # a kind's first credit is for its first call only
        if self.progress is not None and self.spent > 0:
            step = self.step_cost()
            credit = credit + LOSS_BUDGET * self.horizon - self.regret(step) / step
            credit = min(max(credit, 0.0), CREDIT_CAP * LOSS_BUDGET * self.horizon)
        return {"cost": self.cost.state(), "steps": list(self.steps), "credit": credit}

    def load(self, state: dict) -> None:
        self.cost.load(state["cost"])   # the caller calls choose() once the cost can be evaluated
        self.steps = list(state.get("steps", ()))
        self.credit = state.get("credit")

    def _credit(self) -> float:
        """The credit this call starts with, in target steps (a kind's first call: FIRST_CREDIT budgets)."""
        return FIRST_CREDIT * LOSS_BUDGET * self.horizon if self.credit is None else float(self.credit)


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
