"""Replays decoding with the H200's measured per-round costs to compare gamma policies at equal work,
without a GPU: `gamma="auto"` against every fixed gamma, per pair and batch size.

Per-round costs: the median model GPU time per round of each fixed gamma in a committed
`bench decode` result (benchmarks/results/decode_{pair}_h200.json; gamma 7, 9, 11 interpolated).
Rounds: the embedded pair decodes the benchmark's prompts on the CPU (128 new tokens, EOS ignored,
the benchmark's prompt per seed); a call's time is the sum of its rounds' costs, so a policy is
judged by the rounds it chooses, as on the GPU, minus the loop's overhead (efficiency ~1 there).

    --method greedy   exact replay: greedy tokens do not depend on gamma, so each prompt's agreement
                      run A(t) (how many of the draft's greedy tokens from position t on match the
                      target's) is computed once, and a round at t with d drafts accepts min(d, A(t))
    --method exact    the CPU decoder runs every configuration (T = 1, seeds 0..N-1); auto gamma
                      counts each round's expected acceptance, as generate() hands it the policy

Auto gamma runs as the benchmark runs it: a warm-up call per seed, then the measured calls, on one
decoder (what a call keeps for the next applies). Costs are the table's, not measured.

    python3 benchmarks/auto_gamma_sim.py --method greedy [--seeds 5] [--lag 1]

Synthetic replays (tests/test_gamma_policy_target_only.py): synthetic_call() decodes one call with
rounds whose costs are a function of gamma (0: a target step) and whose acceptance is drawn per
draft at a fixed probability, handing the policy each round's time as a loop does (lag: rounds
read late, as the device loop), and decoder_calls() runs calls as generate() does (what a call
keeps for the next, target-only calls when the last preferred them, REPROBE). No decoder needed.
"""
import argparse
import json
import statistics
from pathlib import Path

import numpy as np

import specsample_cupy.decode.decoder as decoder_module
from specsample_cupy.decode import gamma_policy
from specsample_cupy.decode.decoder import SpeculativeDecoder
from specsample_cupy.decode.stats import Round

RESULTS = Path(__file__).resolve().parent / "results"
PAIRS, BATCHES, N, CAP = ("cost-1.5b", "cost-7b", "embedded"), (1, 4), 128, 12


class TableCost:
    """A gamma policy's cost from the table: seconds per round of gamma drafts (nothing to learn)."""

    def __init__(self, table):
        self.table = table

    def observe(self, gamma, seconds):
        pass

    def state(self):
        return None

    def load(self, state):
        pass

    def __call__(self, gammas):
        return np.array([self.table[int(g)] for g in gammas])


def cost_table(pair: str, batch: int, method: str) -> dict:
    """Median model seconds per round for gamma 0..CAP at this batch size (bench decode's JSON)."""
    data = json.loads((RESULTS / f"decode_{pair}_h200.json").read_text())
    rows = next(r for r in data["runs"] if r["batch"] == batch)["rows"]
    per = {int(r["gamma"]): statistics.median(x["model_s"] / x["rounds"] for x in r["runs"])
           for r in rows if r["method"] in (method, "target") and r["gamma"] != "auto"}
    known = sorted(per)
    return {g: float(np.interp(g, known, [per[k] for k in known])) for g in range(CAP + 1)}


def benchmark_prompts() -> list[str]:
    """The benchmark's prompts (imported here: the synthetic replays need no benchmark)."""
    from specsample_cupy.bench.decode import DEFAULT_PROMPTS
    return list(DEFAULT_PROMPTS[:max(BATCHES)])


def prompts_of(batch: int, seed: int) -> list[str]:
    prompts = benchmark_prompts()
    return [prompts[(seed * batch + i) % len(prompts)] for i in range(batch)]


def agreement_runs(dec) -> dict:
    """Per prompt, A(t) for t < N: the draft's greedy run of agreement with the target's tokens."""
    runs = {}
    for prompt in benchmark_prompts():
        ids = dec.target_spec.encode(prompt)
        full = dec.generate([ids], max_new_tokens=N + CAP + 1, gamma=0, method="greedy", ignore_eos=True).token_ids[0]
        runs[prompt] = []
        for t in range(N):
            seen = []
            dec.generate([ids + full[:t]], max_new_tokens=CAP + 1, gamma=CAP, method="greedy", ignore_eos=True,
                         on_round=lambda rnd, req: seen.append(int(rnd.accepted[0])) or None)
            runs[prompt].append(seen[0])
    return runs


def replay(runs, batch_prompts, policy, table, lag: int) -> float:
    """Seconds of one greedy call under `policy`; the policy sees each round `lag` rounds late, with
    its time (the table's)."""
    t, total, unread = np.zeros(len(batch_prompts), int), 0.0, []
    policy.begin(N, probe_steps=1 if lag else 2)
    while (t < N).any():
        gamma = policy.next_gamma()
        live = t < N
        drafts = np.where(live, np.minimum(gamma, N - t - 1), 0)
        accepted = np.array([min(d, runs[p][k]) if a else 0 for p, k, d, a in zip(batch_prompts, t, drafts, live)])
        seconds = table[int(drafts.max())]
        total += seconds
        unread.append((Round(live, drafts, accepted, np.where(live, accepted + 1, 0), int(drafts.max())), seconds))
        t = t + np.where(live, accepted + 1, 0)
        if len(unread) > lag:
            policy.observe(*unread.pop(0))
    while unread:
        policy.observe(*unread.pop(0))
    return total


def synthetic_call(policy, cost, alpha, n: int = N, batch: int = 1, lag: int = 0, seed: int = 0,
                   jitter: float = 0.0) -> tuple[float, list[int]]:
    """(seconds, the rounds' gammas) of one call generating n tokens per request under `policy`: a round
    of g drafts costs cost(g) seconds (g = 0: a target step) times a log-normal factor of sigma
    `jitter`; request b accepts each draft with probability alpha (a float, or [batch]) until its
    first rejection; rows near their budget draft fewer (Requests.draft_lengths). The policy gets each
    round and its time `lag` rounds late and every round before the call returns: lag 0 is the host
    loop (a round runs its longest proposal's drafts, and says so: observe()'s `ran`), 1-2 the
    device loop (a round of g runs g draft runs whatever the rows propose)."""
    rng = np.random.default_rng(seed)
    alpha = np.broadcast_to(np.asarray(alpha, np.float64), (batch,))
    t, total, unread, gammas = np.zeros(batch, np.int64), 0.0, [], []
    policy.begin(n, probe_steps=1 if lag else 2)
    while (t < n).any():
        gamma = policy.next_gamma()
        gammas.append(gamma)
        live = t < n
        drafts = np.where(live, np.minimum(gamma, n - t - 1), 0)
        accepted = np.zeros(batch, np.int64)
        for b in np.flatnonzero(drafts).tolist():
            while accepted[b] < drafts[b] and rng.random() < alpha[b]:
                accepted[b] += 1
        taken = np.where(live, np.minimum(accepted + 1, n - t), 0)
        ran = int(drafts.max()) if lag == 0 else gamma
        seconds = float(cost(ran)) * float(np.exp(jitter * rng.standard_normal()))
        total += seconds
        unread.append((Round(live, drafts, accepted, taken, gamma), seconds, ran if lag == 0 else None))
        t = t + taken
        if len(unread) > lag:
            policy.observe(*unread.pop(0))
    while unread:
        policy.observe(*unread.pop(0))
    return total, gammas


def decoder_calls(make_policy, call, calls: int, target_only_seconds: float) -> list[tuple[float, list[int]]]:
    """(seconds, gammas) of `calls` automatic-gamma calls of one kind as generate() runs them: each call
    starts from what the last kept (make_policy(): a fresh policy; state() / load(), then choose()),
    and runs target-only (target_only_seconds, gammas [0]) when the last preferred it, bar every
    REPROBE-th call. call(k, policy) -> (seconds, gammas) runs call k."""
    state, target_only, out = None, False, []
    for k in range(calls):
        if target_only and (k + 1) % gamma_policy.REPROBE:
            out.append((target_only_seconds, [0]))
            continue
        policy = make_policy()
        if state is not None:
            policy.load(state)
            policy.choose()
        out.append(call(k, policy))
        state, target_only = policy.state(), policy.prefers_target_only()
    return out


class IdsDecoder(SpeculativeDecoder):
    def encode_prompts(self, prompts):
        return [list(p) if isinstance(p, list) else self.target_spec.encode(p) for p in prompts]


def auto_calls(seeds: int, batch: int, table, call) -> list[float]:
    """Seconds of the measured auto calls: as the benchmark and the decoder run them, a warm-up call
    per seed, then one per seed; each call starts from what the one before kept (costs), runs
    target-only when the one before preferred it, bar every REPROBE-th call. call(seed, policy)."""
    state, target_only, measured = None, False, []
    for k, seed in enumerate(list(range(seeds)) * 2):
        if target_only and (k + 1) % gamma_policy.REPROBE:
            seconds = N * table[0]
        else:
            policy = gamma_policy.AutoGamma(4, 1, CAP, TableCost(table))
            if state is not None:
                policy.load(state)
            policy.choose()
            seconds = call(seed, policy)
            state, target_only = policy.state(), policy.prefers_target_only()
        if k >= seeds:
            measured.append(seconds)
    return measured


def greedy_rows(seeds: int, lag: int):
    runs = agreement_runs(IdsDecoder(device="cpu"))
    for pair in PAIRS:
        for batch in BATCHES:
            table = cost_table(pair, batch, "greedy")
            calls = {g: [replay(runs, prompts_of(batch, s), gamma_policy.FixedGamma(g), table, lag) if g else
                         N * table[0] for s in range(seeds)] for g in range(CAP + 1)}
            calls["auto"] = auto_calls(seeds, batch, table,
                                       lambda seed, policy: replay(runs, prompts_of(batch, seed), policy, table, lag))
            yield pair, batch, calls


def table_timed(policy, table):
    """`policy`, told each round's time from the table (the round's gamma as it ran) in place of the
    CPU's wall time, which its loss budget would otherwise weigh against the table's step cost."""
    observe = policy.observe

    def timed(rnd, seconds=None, ran=None):
        observe(rnd, table[int(rnd.gamma if ran is None else ran)], ran)

    policy.observe = timed
    return policy


def sampled_rows(seeds: int, method: str = "exact", temperature: float = 1.0):
    dec = SpeculativeDecoder(device="cpu")

    def rounds(d, batch, seed, gamma):
        drafts = []
        d.generate(prompts_of(batch, seed), max_new_tokens=N, gamma=gamma, method=method, temperature=temperature,
                   seed=seed, ignore_eos=True,
                   on_round=lambda rnd, req: drafts.append(int(rnd.draft_len.max()) if rnd.gamma else 0) or None)
        return drafts

    fixed = {(b, g): [rounds(dec, b, s, g) for s in range(seeds)] for b in BATCHES for g in range(CAP + 1)}
    make_policy = decoder_module.make_policy
    try:
        for pair in PAIRS:
            for batch in BATCHES:
                table = cost_table(pair, batch, method)
                decoder_module.make_policy = lambda g, mode, lo, hi, cost=None, **kw: table_timed(make_policy(
                    g, mode, lo, hi, TableCost(table) if mode == "auto" else cost, **kw), table)
                auto = SpeculativeDecoder(device="cpu")
                for s in range(seeds):
                    rounds(auto, batch, s, "auto")
                timed = {g: [sum(table[x] for x in r) for r in fixed[(batch, g)]] for g in range(CAP + 1)}
                timed["auto"] = [sum(table[x] for x in rounds(auto, batch, s, "auto")) for s in range(seeds)]
                yield pair, batch, timed
    finally:
        decoder_module.make_policy = make_policy


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", choices=("greedy", "exact"), default="greedy")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--lag", type=int, default=1, help="rounds between a round and the policy seeing it (greedy)")
    args = ap.parse_args()
    rows = greedy_rows(args.seeds, args.lag) if args.method == "greedy" else sampled_rows(args.seeds)
    print("| pair | B | best fixed gamma: speed-up | auto: speed-up | auto / best fixed |")
    print("|---|---|---|---|---|")
    for pair, batch, seconds in rows:
        speedup = {g: statistics.median(t0 / t for t0, t in zip(seconds[0], v)) for g, v in seconds.items() if g != 0}
        best = max((g for g in speedup if g != "auto"), key=speedup.get)
        print(f"| {pair} | {batch} | {best}: {speedup[best]:.2f}x | {speedup['auto']:.2f}x | "
              f"{speedup['auto'] / speedup[best]:.3f} |", flush=True)


if __name__ == "__main__":
    main()
