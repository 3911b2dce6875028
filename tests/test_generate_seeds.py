"""Independent samples by default (specsample_cupy/verification/seeds.py): every request draws from its own random
stream, derived from the run's base seed and the request's index (generate()) or id (`specsample
generate`), so copies of one prompt are independent draws from the target's distribution, a request
draws the same tokens alone or in any batch, and a request's own seed wins.

On the embedded stdlib pair, CPU. The chi-squared tests use fixed seeds: deterministic, and an exact
sampler fails one with probability 1e-3.
"""
import json

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
stats = pytest.importorskip("scipy.stats")

from helpers_cli import split_runner  # noqa: E402
from models.ort_decoder import OrtDecoder  # noqa: E402
from specsample_cupy.cli.decode import decode  # noqa: E402
from specsample_cupy.cli.generate import generate  # noqa: E402
from specsample_cupy.decode.continuous import StreamRequest  # noqa: E402
from specsample_cupy.decode.decoder import SpeculativeDecoder, default_model_dir  # noqa: E402
from specsample_cupy.verification.seeds import MASK64, key_of_id, request_seed, resolve_seeds  # noqa: E402

COPIES = 2000
PROMPT = "x"   # its first token is spread over dozens of likely ids (the example)
P_VALUE_THRESHOLD = 1e-3


@pytest.fixture(scope="module")
def dec():
    return SpeculativeDecoder(device="cpu")


@pytest.fixture(scope="module")
def first_token_probabilities(dec):
    """p(t | PROMPT) at T = 1, from the target alone (a separate ONNX runner)."""
    logits = OrtDecoder(str(default_model_dir("target")))(np.array([dec.target_spec.encode(PROMPT)]))[0][0, -1]
    z = logits.astype(np.float64)
    p = np.exp(z - z.max())
    return p / p.sum()


def _chi_square_p_value(first_tokens, p):
    """Chi-squared test of the first tokens' histogram against p; cells expecting < 5 draws are pooled."""
    observed = np.bincount(first_tokens, minlength=p.size).astype(np.float64)
    expected = p * len(first_tokens)
    sparse = expected < 5
    observed = np.append(observed[~sparse], observed[sparse].sum())
    expected = np.append(expected[~sparse], expected[sparse].sum())
    chi2 = ((observed - expected) ** 2 / expected).sum()
    return stats.chi2.sf(chi2, df=len(observed) - 1)


def test_the_seed_rule():
    assert request_seed(5, 0) == 5 and request_seed(-3, 0) == -3   # request 0: the base itself
    seeds = {request_seed(base, key) for base in range(64) for key in range(1, 64)}
    assert len(seeds) == 64 * 63 and all(0 <= s < 2 ** 63 for s in seeds)
    # No base + index arithmetic: request k of base S is not request k - 1 of base S + 1, nor a base.
    assert request_seed(7, 3) != request_seed(8, 2) and request_seed(0, 1) not in range(1 << 16)
    assert request_seed(2 ** 64 + 7, 3) == request_seed(7, 3)   # bases are taken mod 2^64
    assert key_of_id("a") != key_of_id(["a"]) and 0 <= key_of_id(12) <= MASK64
    base, seeds = resolve_seeds(None, [None, 9], 2)
    assert seeds == [base, 9] and 0 <= base < 2 ** 63
    with pytest.raises(ValueError, match="one seed"):
        resolve_seeds(0, [1], 2)
    with pytest.raises(ValueError, match=r"seeds\[0\]"):
        resolve_seeds(0, ["1"], 1)


def test_copies_of_one_prompt_are_independent_draws_of_the_target(dec, first_token_probabilities):
    out = dec.generate([PROMPT] * COPIES, max_new_tokens=1, gamma=2, temperature=1.0, seed=1234)
    first = np.array([ids[0] for ids in out.token_ids])
    assert _chi_square_p_value(first, first_token_probabilities) > P_VALUE_THRESHOLD
    assert len(set(out.stats["seeds"])) == COPIES and out.stats["seed"] == 1234
    # The most likely token comes first about as often as p says, not for (nearly) every copy.
    top = int(first_token_probabilities.argmax())
    assert (first == top).mean() < first_token_probabilities[top] + 0.05
    longer = dec.generate([PROMPT] * 2, max_new_tokens=12, gamma=3, temperature=1.0, seed=0)
    assert longer.token_ids[0] != longer.token_ids[1]


def test_copies_through_specsample_generate_follow_the_target(dec, first_token_probabilities, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": f"c{i}", "prompt": PROMPT}) + "\n" for i in range(COPIES)))
    result = split_runner().invoke(generate, ["--input", str(source), "--output", str(tmp_path / "out.jsonl"),
                                              "--device", "cpu", "--max-new-tokens", "1", "--gamma", "2",
                                              "--batch-size", "500", "--seed", "77", "--no-progress"])
    assert result.exit_code == 0, result.stderr
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(lines) == COPIES and len({line["seed"] for line in lines}) == COPIES
    assert all(line["seed"] == request_seed(77, key_of_id(line["id"])) for line in lines)
    first = np.array([line["token_ids"][0] for line in lines])
    assert _chi_square_p_value(first, first_token_probabilities) > P_VALUE_THRESHOLD


@pytest.mark.parametrize("method,gamma", [("exact", 3), ("sigmoid", 3), ("target", 0)])
def test_a_request_draws_the_same_alone_and_in_any_batch(dec, method, gamma):
    prompts = ["def f(x):", "import os", "x", "class A:", "x"]
    kw = dict(max_new_tokens=10, gamma=gamma, method=method, temperature=0.9)
    batch = dec.generate(prompts, seed=42, **kw)
    for i, p in enumerate(prompts):
        alone = dec.generate([p], seed=batch.stats["seeds"][i], **kw)
        assert alone.token_ids[0] == batch.token_ids[i], i
    # Reordered, with other neighbours: each request keeps its own tokens through its own seed.
    order = [4, 2, 0]
    other = dec.generate(["zzz"] + [prompts[i] for i in order], seeds=[None] + [batch.stats["seeds"][i] for i in order],
                         seed=9, **kw)
    assert other.token_ids[1:] == [batch.token_ids[i] for i in order]
    assert batch.token_ids[2] != batch.token_ids[4]   # the two copies of "x" are two samples


def test_stream_requests_derive_their_seeds_like_generate(dec):
    prompts = ["x", "x", "def f(x):"]
    kw = dict(gamma=3, method="exact")
    stream = dec.generate_stream([StreamRequest(p, 8) for p in prompts], batch_size=2, seed=5, **kw)
    results = {r.index: r for r in stream}
    batch = dec.generate(prompts, max_new_tokens=8, seed=5, **kw)
    assert [results[i].stats["seed"] for i in range(3)] == batch.stats["seeds"] and stream.stats["seed"] == 5
    assert [results[i].token_ids for i in range(3)] == batch.token_ids
    own = next(iter(dec.generate_stream([StreamRequest("x", 8, seed=batch.stats["seeds"][1])], **kw)))
    assert own.token_ids == batch.token_ids[1]


def test_a_lines_own_seed_reproduces_it_anywhere(dec, tmp_path):
    """A line's own "seed" s draws what `decode --seed s` draws, whatever its id, neighbours and order;
    a line without one records the derived seed, which reproduces it as a line's own seed."""
    def run(objects, name):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(o) + "\n" for o in objects))
        result = split_runner().invoke(generate, ["--input", str(tmp_path / f"{name}.jsonl"), "--output",
                                                  str(tmp_path / f"{name}.out"), "--device", "cpu",
                                                  "--max-new-tokens", "10", "--batch-size", "3", "--no-progress"])
        assert result.exit_code == 0, result.stderr
        return {line["id"]: line for line in map(json.loads, (tmp_path / f"{name}.out").read_text().splitlines())}

    first = run([{"id": i, "prompt": p} for i, p in enumerate(["x", "def f(", "import", "x"])] +
                [{"id": "own", "prompt": "x", "seed": 7}], "first")
    assert first["own"]["seed_from"] == "line" and first[0]["seed_from"] == "run"
    again = run([{"id": "again", "prompt": "x", "seed": first[3]["seed"]}, {"id": "z", "prompt": "x", "seed": 7},
                 {"id": "y", "prompt": "zz"}], "again")
    assert again["again"]["token_ids"] == first[3]["token_ids"]
    assert again["z"]["token_ids"] == first["own"]["token_ids"]
    decoded = split_runner().invoke(decode, ["--prompt", "x", "--seed", "7", "--device", "cpu", "--max-new-tokens",
                                             "10", "--jsonl", "--no-stats"])
    assert decoded.exit_code == 0, decoded.stderr
    assert json.loads(decoded.stdout)["token_ids"] == first["own"]["token_ids"]


def test_seed_random_draws_a_base_and_records_it(dec, tmp_path):
    out = dec.generate(["x"] * 2, max_new_tokens=4, seed=None)
    assert out.stats["seeds"][0] == out.stats["seed"] and isinstance(out.stats["seed"], int)
    source = tmp_path / "in.txt"
    source.write_text("x\nx\n")
    args = ["--input", str(source), "--device", "cpu", "--max-new-tokens", "4", "--seed", "random", "--no-progress"]
    first = split_runner().invoke(generate, args + ["--output", str(tmp_path / "a.jsonl")])
    assert first.exit_code == 0, first.stderr
    lines = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    base = lines[0]["settings"]["seed"]
    assert f"base seed {base}" in first.stderr and lines[0]["settings"]["seed_origin"] == "random"
    assert {line["id"]: line["seed"] for line in lines} == {i: request_seed(base, key_of_id(i)) for i in (1, 2)}
    # A resume with --seed random takes the file's base seed: the same command resumes.
    source.write_text("x\nx\nx\n")
    resumed = split_runner().invoke(generate, args + ["--output", str(tmp_path / "a.jsonl")])
    assert resumed.exit_code == 0, resumed.stderr
    last = json.loads((tmp_path / "a.jsonl").read_text().splitlines()[-1])
    assert last["id"] == 3 and last["settings"]["seed"] == base
