"""End-to-end exactness of speculative sampling: the tokens it generates follow the target's distribution.

A batch of N copies of one prompt gives N independent draws (each request draws from its own random
stream, specsample_cupy/verification/seeds.py). The first two generated tokens are compared with the target's exact probabilities
p(t1 | prompt) * p(t2 | prompt, t1), computed by a separate ONNX runner, with a chi-squared test.
Threshold: p-value >= 1e-4 (the seed is fixed, so the test is deterministic; an exact sampler fails
it with probability 1e-4, a biased one with N = 20,000 draws almost surely).
"""
import numpy as np
import pytest

pytest.importorskip("onnxruntime")
stats = pytest.importorskip("scipy.stats")

from models.build_tiny import build_tiny_pair  # noqa: E402
from models.ort_decoder import OrtDecoder  # noqa: E402
from specsample_cupy.decode.decoder import SpeculativeDecoder  # noqa: E402

N_DRAWS = 20_000
P_VALUE_THRESHOLD = 1e-4
PROMPT = "the cat"
VOCAB = 16
EOS = 0


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_tiny_pair(str(tmp_path_factory.mktemp("tiny")), vocab_size=VOCAB, seed=0)


@pytest.fixture(scope="module")
def decoder(pair):
    return SpeculativeDecoder(*pair, device="cpu")


def _softmax(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _first_two_token_probabilities(target_dir, prompt_ids, temperature):
    """{(t1, t2) or (EOS,): probability} under the target alone."""
    model = OrtDecoder(target_dir)
    ids = np.array([prompt_ids])
    p1 = _softmax(model(ids)[0][0, -1] / temperature)
    continued = np.concatenate([np.repeat(ids, VOCAB, 0), np.arange(VOCAB)[:, None]], axis=1)
    p2 = _softmax(model(continued)[0][:, -1] / temperature)
    cells = {(EOS,): p1[EOS]}
    for t1 in range(VOCAB):
        if t1 != EOS:
            cells.update({(t1, t2): p1[t1] * p2[t1, t2] for t2 in range(VOCAB)})
    return cells


def _chi_square_p_value(token_ids, cells):
    """Chi-squared test of the first two tokens of each request against `cells`; sparse cells are pooled."""
    index = {cell: i for i, cell in enumerate(cells)}
    observed = np.zeros(len(cells))
    for ids in token_ids:
        observed[index[tuple(ids[:1]) if ids[0] == EOS else tuple(ids[:2])]] += 1
    expected = np.array(list(cells.values())) * len(token_ids)
    sparse = expected < 5
    observed = np.append(observed[~sparse], observed[sparse].sum())
    expected = np.append(expected[~sparse], expected[sparse].sum())
    expected *= observed.sum() / expected.sum()
    chi2 = ((observed - expected) ** 2 / expected).sum()
    return stats.chi2.sf(chi2, df=len(observed) - 1)


@pytest.mark.parametrize("method,gamma,temperature", [
    pytest.param("exact", 3, 1.0, marks=pytest.mark.slow),   # 20,000 draws: 5-7 s each on 2 cores
    pytest.param("exact", 2, 0.6, marks=pytest.mark.slow),
    pytest.param("baseline", 3, 1.0, marks=pytest.mark.slow),
    ("target", 0, 1.0),
])
def test_first_two_tokens_follow_the_target_distribution(decoder, pair, method, gamma, temperature):
    prompt_ids = decoder.target_spec.encode(PROMPT)
    cells = _first_two_token_probabilities(pair[0], prompt_ids, temperature)
    out = decoder.generate([PROMPT] * N_DRAWS, max_new_tokens=max(gamma + 1, 2), gamma=gamma, method=method,
                           temperature=temperature, seed=11)
    if method != "target":
        # Drafts were really proposed and both accepted and rejected.
        assert 0.2 < out.stats["acceptance_rate"] < 0.95, out.stats
    p_value = _chi_square_p_value(out.token_ids, cells)
    assert p_value >= P_VALUE_THRESHOLD, f"{method}: chi-squared p-value {p_value:.2e}"


@pytest.mark.slow
def test_sampling_detects_a_wrong_distribution(decoder, pair):
    """The test has power: draws at temperature 1.0 are rejected against probabilities at 0.8."""
    prompt_ids = decoder.target_spec.encode(PROMPT)
    cells = _first_two_token_probabilities(pair[0], prompt_ids, 0.8)
    out = decoder.generate([PROMPT] * N_DRAWS, max_new_tokens=3, gamma=2, temperature=1.0, seed=2)
    assert _chi_square_p_value(out.token_ids, cells) < P_VALUE_THRESHOLD


def test_same_seed_same_tokens_other_seed_other_tokens(decoder):
    prompts = ["the cat", "a", "sea"]
    a = decoder.generate(prompts, max_new_tokens=24, gamma=3, temperature=1.0, seed=7)
    b = decoder.generate(prompts, max_new_tokens=24, gamma=3, temperature=1.0, seed=7)
    c = decoder.generate(prompts, max_new_tokens=24, gamma=3, temperature=1.0, seed=8)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids
