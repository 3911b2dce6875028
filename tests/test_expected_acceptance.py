"""Expected acceptance (acceptance.expected_acceptance: beta = sum_x min(p, q) per draft position),
which automatic gamma counts for exact sampling in place of the accepted drafts: the formula, the
acceptance probability of exact verification it stands for (chi-squared), and the loops that report
it on the CPU."""
import numpy as np
import pytest

from specsample_cupy.decode.acceptance import expected_acceptance, expected_accepted
from specsample_cupy.verification.api import verify


def softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_expected_acceptance_is_one_minus_total_variation():
    rng = np.random.default_rng(0)
    B, g, V = 3, 4, 50
    draft, target = rng.normal(0, 2, (B, g, V)), rng.normal(0, 2, (B, g + 1, V))
    temps = np.array([1.0, 0.5, 2.0])
    draft_len = np.array([4, 2, 0])
    beta = expected_acceptance(np, draft.astype(np.float32), target.astype(np.float32), temps, draft_len)
    for b in range(B):
        for i in range(g):
            p = softmax(target[b, i].astype(np.float32) / temps[b])
            q = softmax(draft[b, i].astype(np.float32) / temps[b])
            want = 1 - 0.5 * np.abs(p - q).sum() if i < draft_len[b] else 0.0
            assert beta[b, i] == pytest.approx(want, abs=1e-9)
    same = expected_acceptance(np, target[:, :g], target, 0.8, np.full(B, g))
    np.testing.assert_allclose(same, 1.0, atol=1e-12)


def test_expected_accepted_sums_the_positions_tried():
    beta = np.array([[0.9, 0.8, 0.7, 0.6], [0.5, 0.4, 0.3, 0.2], [0.1, 0.2, 0.3, 0.4]])
    draft_len, accepted = np.array([4, 4, 2]), np.array([4, 1, 0])
    # All four tried (all accepted); a rejection at position 1 ends after two; rejected at 0: one.
    np.testing.assert_allclose(expected_accepted(beta, draft_len, accepted), [3.0, 0.9, 0.1])


def test_verify_accepts_a_draft_with_probability_beta():
    """Exact verification accepts a draft sampled from q with probability sum_x min(p, q): N requests
    with the same rows, drafts drawn from q, accepted counts against beta by a chi-squared test
    (1 degree of freedom, fixed seed, p-value above 1e-3)."""
    from scipy import stats
    rng = np.random.default_rng(5)
    V, N = 12, 20000
    target = rng.normal(0, 1.5, (1, 2, V)).astype(np.float32)
    draft = rng.normal(0, 1.5, (1, 1, V)).astype(np.float32)
    T = 0.8
    beta = float(expected_acceptance(np, draft, target, T, np.array([1]))[0, 0])
    q = softmax(draft[0, 0].astype(np.float64) / T)
    tokens = rng.choice(V, size=(N, 1), p=q).astype(np.int64)
    res = verify(tokens, np.repeat(draft, N, axis=0), np.repeat(target, N, axis=0), method="exact",
                 temperature=T, seed=11)
    accepted = int((res.emitted == 2).sum())
    observed = [accepted, N - accepted]
    expected = [N * beta, N * (1 - beta)]
    assert stats.chisquare(observed, expected).pvalue > 1e-3, (accepted / N, beta)


@pytest.fixture(scope="module")
def decoder():
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    return SpeculativeDecoder(device="cpu")


@pytest.mark.parametrize("method,temperature,reports", [("exact", 1.0, True), ("exact", 0.6, True),
                                                        ("greedy", 0.0, False), ("sigmoid", 1.0, False)])
def test_host_rounds_report_expected_acceptance_for_auto_exact_sampling(decoder, method, temperature, reports):
    rounds = []
    decoder.generate(["def main():", "import os"], max_new_tokens=24, gamma="auto", method=method,
                     temperature=temperature, seed=3, ignore_eos=True, on_round=lambda rnd, req: rounds.append(rnd))
    speculative = [r for r in rounds if r.gamma]
    assert speculative
    for rnd in speculative:
        if not reports:
            assert rnd.expected_accepted is None
            continue
        tried = np.where(rnd.active, np.minimum(rnd.accepted + 1, rnd.draft_len), 0)
        assert np.all(rnd.expected_accepted >= 0) and np.all(rnd.expected_accepted <= tried + 1e-9)
        assert np.all(rnd.expected_accepted[tried == 0] == 0)


def test_fixed_gamma_reports_no_expected_acceptance(decoder):
    rounds = []
    decoder.generate(["def main():"], max_new_tokens=12, gamma=3, method="exact", temperature=1.0, seed=3,
                     ignore_eos=True, on_round=lambda rnd, req: rounds.append(rnd))
    assert all(r.expected_accepted is None for r in rounds)
