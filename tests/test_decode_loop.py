"""The decode loop's contract on the CPU: equal work (ignore_eos), finish reasons, gamma policies
(greedy output is the same at every gamma, automatic included), the round hook, one call at a time."""
import threading

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from specsample_cupy.decode.decoder import SpeculativeDecoder  # noqa: E402
from specsample_cupy.decode.acceptance import expected_tokens  # noqa: E402
from specsample_cupy.decode.gamma_policy import AutoGamma, LineCost, make_policy  # noqa: E402
from specsample_cupy.decode.stats import Round  # noqa: E402

PROMPTS = ["the rain in spain", "a", "hello there, a test of holes", "dense"]


@pytest.fixture(scope="module")
def decoder(pair):
    return SpeculativeDecoder(*pair, device="cpu")


@pytest.mark.parametrize("method,gamma", [("target", 0), ("exact", 3), ("greedy", 5), ("greedy", "auto"),
                                          ("sigmoid", 2)])
def test_ignore_eos_generates_exactly_the_budget(decoder, method, gamma):
    decoder.target_spec.eos_token_ids = (0, 1, 2, 3, 4, 5)   # frequent ids: most requests would stop early
    try:
        stopped = decoder.generate(PROMPTS, max_new_tokens=30, gamma=gamma, method=method, seed=2)
        out = decoder.generate(PROMPTS, max_new_tokens=30, gamma=gamma, method=method, seed=2, ignore_eos=True)
    finally:
        decoder.target_spec.eos_token_ids = (0,)
    assert any(len(t) < 30 for t in stopped.token_ids), "the EOS ids should end some request early"
    assert "eos" in stopped.finish_reasons
    assert [len(t) for t in out.token_ids] == [30] * len(PROMPTS)
    assert out.finish_reasons == ["length"] * len(PROMPTS)
    assert out.stats["generated_tokens"] == 30 * len(PROMPTS)


def test_context_end_is_a_finish_reason(decoder):
    long_prompt = "x " * 4
    while len(decoder.encode_prompts([long_prompt])[0]) < decoder.context_length - 10:
        long_prompt += "x "
    n_prompt = len(decoder.encode_prompts([long_prompt])[0])
    out = decoder.generate([long_prompt, "a"], max_new_tokens=40, gamma=2, method="greedy", ignore_eos=True)
    assert len(out.token_ids[0]) == decoder.context_length - n_prompt < 40
    assert out.finish_reasons == ["context", "length"]


def test_empty_prompt_starts_from_bos(decoder):
    assert decoder.target_spec.bos_token_id is not None
    out = decoder.generate([""], max_new_tokens=5, method="greedy", ignore_eos=True)
    assert len(out.token_ids[0]) == 5


@pytest.mark.parametrize("gamma,extra", [(1, {}), (4, {}), (7, {}), (2, {"adaptive_gamma": True}),
                                         ("auto", {}), ("auto", {"gamma_min": 2, "gamma_max": 3})])
def test_greedy_output_is_the_same_at_every_gamma(decoder, gamma, extra):
    expected = decoder.generate(PROMPTS, max_new_tokens=40, method="target", temperature=0).token_ids
    out = decoder.generate(PROMPTS, max_new_tokens=40, gamma=gamma, method="greedy", **extra)
    assert out.token_ids == expected
    if gamma == "auto":
        lo, hi = extra.get("gamma_min", 1), extra.get("gamma_max", 12)
        assert out.stats["gamma_mode"] == "auto"
        assert out.stats["mean_gamma"] == 0 if out.stats["auto_target_only"] else lo <= out.stats["mean_gamma"] <= hi


def test_auto_gamma_remembers_and_may_run_target_only(pair):
    """A call's measurements seed the next call of its kind; when they say drafting does not pay, calls
    run target-only (same tokens, greedy), and every REPROBE-th call speculates again."""
    from specsample_cupy.decode.gamma_policy import REPROBE
    dec = SpeculativeDecoder(*pair, device="cpu")
    kwargs = dict(max_new_tokens=20, gamma="auto", method="greedy")
    first = dec.generate(PROMPTS, **kwargs)
    # It drafted (and may then have stopped: drafting the tiny pair on a CPU seldom pays).
    assert not first.stats["auto_target_only"] and first.stats["proposed"] > 0
    memory = dec._auto_memory[("greedy", 0.0, len(PROMPTS))]   # greedy decodes at 0
    assert memory["state"]["cost"][0] > 0 and memory["calls"] == 1   # the round times it fitted
    memory["target_only"] = True
    expected = dec.generate(PROMPTS, max_new_tokens=20, method="target", temperature=0).token_ids
    outs = [dec.generate(PROMPTS, **kwargs) for _ in range(REPROBE - 1)]
    assert [o.stats["auto_target_only"] for o in outs] == [True] * (REPROBE - 2) + [False]
    assert all(o.token_ids == expected for o in outs)
    assert outs[0].stats["rounds"] == 20 and outs[0].stats["method"] == "target"


def test_round_hook_sees_every_round_and_can_stop_requests(decoder):
    seen = []

    def hook(rnd, req):
        seen.append(rnd)
        return [1] if req.seq_len[1] - req.prompt_len[1] >= 4 else None

    out = decoder.generate(PROMPTS, max_new_tokens=30, gamma=3, method="greedy", on_round=hook, ignore_eos=True)
    assert len(seen) == out.stats["rounds"]
    assert sum(int(r.taken.sum()) for r in seen) == sum(map(len, out.token_ids))
    assert out.finish_reasons[1] == "stop" and 4 <= len(out.token_ids[1]) <= 7
    assert [len(out.token_ids[b]) for b in (0, 2, 3)] == [30, 30, 30]


def test_one_generate_at_a_time(decoder):
    """A second call while one runs (another thread) is refused, not interleaved."""
    started, release = threading.Event(), threading.Event()

    def slow_hook(rnd, req):
        started.set()
        release.wait(5)

    errors = []
    worker = threading.Thread(target=lambda: decoder.generate(PROMPTS[:1], max_new_tokens=3, gamma=1,
                                                              method="greedy", on_round=slow_hook))
    worker.start()
    assert started.wait(5)
    try:
        decoder.generate(PROMPTS[:1], max_new_tokens=2)
    except RuntimeError as e:
        errors.append(str(e))
    release.set()
    worker.join()
    assert errors and "one generate() at a time" in errors[0]
    decoder.generate(PROMPTS[:1], max_new_tokens=2)   # free again


def test_expected_tokens_is_the_truncated_geometric_mean():
    rng = np.random.default_rng(0)
    for alpha in (0.3, 0.8):
        for gamma in (1, 4):
            accepted = np.minimum(rng.geometric(1 - alpha, 200_000) - 1, gamma)
            assert abs(expected_tokens(alpha, gamma) - (accepted + 1).mean()) < 0.02


def _round(gamma, accepted, draft_len=None):
    accepted = np.asarray(accepted)
    draft_len = np.full(accepted.shape, gamma) if draft_len is None else np.asarray(draft_len)
    return Round(np.ones(accepted.shape, bool), draft_len, accepted, accepted + 1, gamma)


def test_auto_gamma_follows_acceptance_and_cost():
    """High acceptance and cheap drafts: long rounds; low acceptance or dear drafts: short ones."""
    rng = np.random.default_rng(1)
    everything = AutoGamma(4, 1, 12, cost=lambda g: 1.0 + 0.8 * np.asarray(g, float))
    for _ in range(40):
        everything.observe(_round(everything.gamma, [everything.gamma] * 2))   # every draft accepted
    # (the choice: next_gamma() also weighs the loss budget, which these untimed rounds leave unspent)
    assert everything.gamma == 12 and everything.alpha.min() > 0.95
    cheap = AutoGamma(4, 1, 12, cost=lambda g: 1.0 + 0.05 * np.asarray(g, float))
    dear = AutoGamma(4, 1, 12, cost=lambda g: 1.0 + 0.5 * np.asarray(g, float))   # (0.8: no faster than target steps)
    for _ in range(200):
        for policy in (cheap, dear):   # acceptance 0.8 per draft
            policy.observe(_round(policy.gamma, np.minimum(rng.geometric(0.2, 4) - 1, policy.gamma)))
    assert abs(cheap.alpha.mean() - 0.8) < 0.1 and abs(dear.alpha.mean() - 0.8) < 0.1
    # argmax of (1 - 0.8^(g+1)) / 0.2 / cost(g): 8 for the cheap drafts, 2 for the dear ones
    assert 7 <= cheap.next_gamma() <= 12 and 1 <= dear.next_gamma() <= 3
    low = AutoGamma(4, 1, 12, cost=lambda g: 1.0 + 0.05 * np.asarray(g, float))
    for _ in range(40):
        low.observe(_round(low.gamma, [0, 0]))   # nothing accepted
    assert low.next_gamma() == 1 and low.alpha.max() < 0.1


def test_auto_gamma_is_set_by_the_slowest_request():
    """A batch returns when its last request is done: the gamma is the one that maximises the slowest
    live row's tokens per second, not the rows' mean (which long rounds would win here)."""
    rng = np.random.default_rng(3)
    cost = lambda g: 1.0 + 0.3 * np.asarray(g, float)   # noqa: E731
    policy = AutoGamma(4, 1, 12, cost=cost)
    for _ in range(300):   # acceptance per draft 0.99 and 0.85
        g = policy.gamma
        acc = [min(rng.geometric(0.01) - 1, g), min(rng.geometric(0.15) - 1, g)]
        policy.observe(_round(g, acc))
    alpha = policy.alpha
    assert alpha[0] > 0.95 and 0.75 < alpha[1] < 0.93
    gammas = np.arange(1, 13)
    slowest = np.minimum(expected_tokens(min(alpha[0], 0.999), gammas), expected_tokens(alpha[1], gammas))
    mean = (expected_tokens(min(alpha[0], 0.999), gammas) + expected_tokens(alpha[1], gammas)) / 2
    assert policy.gamma == gammas[np.argmax(slowest / cost(gammas))]
    assert policy.gamma < gammas[np.argmax(mean / cost(gammas))]   # the two rules differ here
    # A finished row no longer counts: only the live one sets gamma.
    rnd = _round(policy.gamma, [0, policy.gamma])
    rnd.active[1] = False
    policy.observe(rnd)
    assert policy.gamma == gammas[np.argmax(expected_tokens(policy.alpha[0], gammas) / cost(gammas))]


def test_auto_gamma_estimates_match_a_plain_reference():
    """Rounds with finished rows and rows that proposed nothing: each request's forgotten acceptance
    estimate, the pooled one and the chosen gamma, against the module docstring's rule in plain
    Python (one request at a time)."""
    from specsample_cupy.decode.gamma_policy import FORGET_GREEDY as FORGET, PRIOR_ALPHA, PRIOR_TRIALS
    rng = np.random.default_rng(9)
    cost = lambda g: 1.0 + 0.2 * np.asarray(g, float)   # noqa: E731
    policy = AutoGamma(4, 1, 12, cost=cost)
    B = 3
    succ, trials = [PRIOR_ALPHA * PRIOR_TRIALS] * B, [PRIOR_TRIALS] * B
    pooled = [[PRIOR_ALPHA * PRIOR_TRIALS] * B, [PRIOR_TRIALS] * B]
    for _ in range(60):
        g = policy.gamma
        active = rng.random(B) < 0.8
        draft_len = np.where(rng.random(B) < 0.2, 0, g)
        accepted = np.minimum(rng.geometric(0.3, B) - 1, draft_len)
        policy.observe(Round(active, draft_len, accepted, accepted + 1, g))
        for b in range(B):
            if active[b] and draft_len[b] > 0:
                rejected = int(accepted[b] < draft_len[b])
                succ[b] = FORGET * succ[b] + int(accepted[b])
                trials[b] = FORGET * trials[b] + int(accepted[b]) + rejected
                pooled[0][b] += int(accepted[b])
                pooled[1][b] += int(accepted[b]) + rejected
        np.testing.assert_allclose(policy.alpha, np.divide(succ, trials), rtol=1e-12)
        np.testing.assert_allclose(policy.pooled, pooled, rtol=1e-12)
        live = [b for b in range(B) if active[b]] or list(range(B))
        rates = [min(expected_tokens(min(succ[b] / trials[b], 0.999), gg) for b in live) / cost(gg)
                 for gg in range(1, 13)]
        assert policy.gamma == 1 + int(np.argmax(rates))


def test_auto_gamma_starts_each_call_from_the_prior_and_decides_on_pooled_acceptance():
    """A call's acceptance estimate starts from the prior (a loaded state brings the costs only), and
    the verdict on speculating at all uses every round of the call, not the forgotten estimate."""
    cost = lambda g: 1.0 + 0.3 * np.asarray(g, float)   # noqa: E731
    fresh = AutoGamma(4, 1, 12, cost=cost)
    fresh.choose()
    seen = AutoGamma(4, 1, 12, cost=cost)
    for _ in range(30):
        seen.observe(_round(seen.gamma, [seen.gamma]))   # every draft accepted: long rounds
    assert seen.gamma == 12 and fresh.gamma < 12
    line = LineCost()
    seen.cost = line
    line.observe(4, 1.0 + 0.3 * 4)
    line.observe(8, 1.0 + 0.3 * 8)
    later = AutoGamma(4, 1, 12, cost=LineCost())
    later.load(seen.state())
    later.choose()
    assert later.gamma == fresh.gamma
    np.testing.assert_allclose(later.cost(np.array([2, 10])), cost(np.array([2, 10])))
    # Thirty rounds accepting everything, then fifteen rejecting at once: the forgotten estimate has
    # fallen below what pays for a draft (at this cost), the call's pooled acceptance has not.
    dear = lambda g: 1.0 + 0.9 * np.asarray(g, float)   # noqa: E731
    policy = AutoGamma(4, 1, 12, cost=dear)
    for _ in range(30):
        policy.observe(_round(policy.gamma, [policy.gamma]))
    for _ in range(15):
        policy.observe(_round(policy.gamma, [0]))
    assert policy.alpha[0] < 0.45
    assert policy._rates(np.array([0]))[0] > policy._rates(np.arange(1, 13)).max()   # by the forgotten one
    assert not policy.prefers_target_only()
    nothing = AutoGamma(4, 1, 12, cost=dear)
    for _ in range(10):
        nothing.observe(_round(nothing.gamma, [0]))
    assert nothing.prefers_target_only()


def test_line_cost_fits_round_times():
    cost = LineCost()
    for g in (2, 5, 2, 5, 3):
        cost.observe(g, 0.004 + 0.001 * g)
    np.testing.assert_allclose(cost(np.array([1, 10])), [0.005, 0.014], rtol=1e-6)


def test_policy_arguments_are_checked():
    with pytest.raises(ValueError, match="gamma_min"):
        make_policy(3, "auto", 4, 2)
    with pytest.raises(ValueError, match="gamma mode"):
        make_policy(3, "sometimes", 1, 4)


def test_auto_gamma_forgets_faster_for_greedy_than_for_sampling(decoder, monkeypatch):
    """Greedy acceptance comes in runs, sampled acceptance with the draws (gamma_policy's docstring):
    generate() hands the call's temperature to the policy, greedy decoding as 0; exact sampling with
    a draft model observes expected acceptance instead of counts, and remembers longer."""
    from specsample_cupy.decode import decoder as decoder_module
    from specsample_cupy.decode.gamma_policy import FORGET_EXPECTED, FORGET_GREEDY, FORGET_SAMPLED
    assert FORGET_GREEDY < FORGET_SAMPLED < FORGET_EXPECTED
    made = []
    real = decoder_module.make_policy
    monkeypatch.setattr(decoder_module, "make_policy", lambda *a, **kw: made.append(real(*a, **kw)) or made[-1])
    for method, temperature in (("greedy", None), ("exact", 0.0), ("sigmoid", 0.7), ("exact", 0.7)):
        decoder.generate(PROMPTS[:2], max_new_tokens=6, gamma="auto", method=method, temperature=temperature)
    assert [p.forget for p in made] == [FORGET_GREEDY, FORGET_GREEDY, FORGET_SAMPLED, FORGET_EXPECTED]
    assert [p.expected for p in made] == [False, False, False, True]
    counting, expecting = made[2], made[3]
    rnd = Round(np.array([True, True]), np.array([4, 4]), np.array([4, 1]), np.array([5, 2]), 4)
    before = list(counting.successes)
    counting.observe(rnd)
    assert counting.successes == pytest.approx([FORGET_SAMPLED * before[0] + 4, FORGET_SAMPLED * before[1] + 1])
    rnd.expected_accepted = np.array([3.25, 0.5])
    before, trials = list(expecting.successes), list(expecting.trials)
    expecting.observe(rnd)
    assert expecting.successes == pytest.approx([FORGET_EXPECTED * before[0] + 3.25, FORGET_EXPECTED * before[1] + 0.5])
    assert expecting.trials == pytest.approx([FORGET_EXPECTED * trials[0] + 4, FORGET_EXPECTED * trials[1] + 2])


def test_device_cost_is_model_time_plus_the_fitted_rest():
    """The device loop's cost: each gamma's calibrated model seconds plus the line fitted to what the
    rounds took beyond them (never negative); a new calibration replaces the kept model seconds."""
    from specsample_cupy.decode.device_loop import DeviceCost
    cost = DeviceCost(None)
    cost.model_s = {g: 1e-3 * (1 + 0.3 * g) for g in range(13)}
    gammas = np.arange(1, 13)
    np.testing.assert_allclose(cost(gammas), [1e-3 * (1 + 0.3 * g) for g in gammas])
    cost.observe(2, 1e-3 * 1.6 + 4e-4)
    cost.observe(6, 1e-3 * 2.8 + 6e-4)     # the rest: 3e-4 + 5e-5 gamma
    np.testing.assert_allclose(cost(gammas), [1e-3 * (1 + 0.3 * g) + 3e-4 + 5e-5 * g for g in gammas])
    np.testing.assert_allclose(cost(np.array([0])), [1e-3 + 3e-4])
    cost.model_s = {g: 2e-3 for g in range(13)}
    np.testing.assert_allclose(cost(gammas), [2e-3 + 3e-4 + 5e-5 * g for g in gammas])


def test_a_round_is_counted_once_in_the_cache_capacity(decoder):
    """The sequences' width already leaves a round beyond the budget: a larger gamma cap widens the
    caches by its extra drafts once (not twice), and the room beyond the width covers the slack and
    the device loop's two rounds in flight."""
    from specsample_cupy.decode.call_loops import new_caches

    class Recording:
        has_position_ids = True

        def new_cache(self, batch, capacity, slack):
            return capacity

    capacity = {}
    for cap in (5, 12, 30):
        req = decoder._requests(PROMPTS, 40, cap, True)
        capacity[cap] = new_caches(decoder, req, [Recording()], cap)[0]
        assert capacity[cap] - req.seq.shape[1] == max(decoder.kv_slack, 2 * (cap + 1))
    assert capacity[12] - capacity[5] == 12 - 5
