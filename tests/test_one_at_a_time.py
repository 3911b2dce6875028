"""Batches for pairs that decode one prompt per call (decode/one_at_a_time.py), on the CPU with
builder-layout folders (GroupQueryAttention, no position_ids, genai_config.json): each request gets
the tokens it gets alone, callbacks see the batch's indices, a request finished by on_round ends
there, and the statistics add up over the calls."""
import numpy as np
import pytest

from models.tool_layouts import builder_folder
from test_convert_decode import PROMPTS, converted_self_pair


@pytest.fixture(scope="module")
def builder_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("one_at_a_time")
    target, draft = converted_self_pair(root, "float32", attention="gqa")
    return builder_folder(target, root / "bt"), builder_folder(draft, root / "bd")


@pytest.fixture(scope="module")
def decoder(builder_pair):
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    return SpeculativeDecoder(*builder_pair, device="cpu")


def test_greedy_batch_gives_each_prompt_its_tokens_alone(decoder):
    args = dict(max_new_tokens=16, method="greedy", temperature=0, ignore_eos=True)
    seen = {b: [] for b in range(len(PROMPTS))}
    out = decoder.generate(PROMPTS, gamma=3, on_tokens=lambda b, ids: seen[b].extend(ids), **args)
    alone = [decoder.generate([p], gamma=0, method="target", temperature=0, ignore_eos=True,
                              max_new_tokens=16).token_ids[0] for p in PROMPTS]
    assert out.token_ids == alone and [seen[b] for b in range(len(PROMPTS))] == alone
    stats = out.stats
    assert stats["one_prompt_at_a_time"].startswith("a model of the pair has no position_ids")
    assert stats["batch"] == len(PROMPTS) and stats["generated_tokens"] == 16 * len(PROMPTS)
    assert stats["acceptance_rate"] == 1.0 and stats["proposed"] == stats["accepted"] > 0


def test_sampled_batch_follows_each_requests_seed(decoder):
    args = dict(max_new_tokens=12, gamma=3, method="exact", temperature=1.0, ignore_eos=True)
    out = decoder.generate(PROMPTS, seed=11, **args)
    assert len(set(out.stats["seeds"])) == len(PROMPTS)
    for i, prompt in enumerate(PROMPTS):
        assert decoder.generate([prompt], seed=out.stats["seeds"][i], **args).token_ids[0] == out.token_ids[i]


def test_on_round_sees_the_batch_and_finishes_by_its_index(decoder):
    rounds = []

    def on_round(rnd, requests):
        rounds.append(requests.finished.tolist())
        return [1] if not requests.finished[1] and requests.finished[0] else []

    out = decoder.generate(PROMPTS, max_new_tokens=12, gamma=2, method="greedy", temperature=0, ignore_eos=True,
                           on_round=on_round)
    assert out.finish_reasons == ["length", "stop", "length"]
    assert len(out.token_ids[1]) < 12 and len(out.token_ids[2]) == 12
    assert all(len(r) == len(PROMPTS) for r in rounds) and rounds[-1] == [True, True, True]


def test_continuous_batching_refuses_such_models_in_one_line(decoder):
    with pytest.raises(ValueError, match="continuous batching needs models with a position_ids input"):
        decoder.generate_stream(PROMPTS, batch_size=2, gamma=3, method="greedy")


def test_merged_stats_add_up():
    from specsample_cupy.decode.one_at_a_time import merged_stats
    one = {"rounds": 4, "proposed": 12, "accepted": 6, "generated_tokens": 10, "prefill_model_time_s": 0.1,
           "sampling_time_s": 0.0, "kv_compactions": 1, "discarded_rounds": 0, "model_time_s": 0.2,
           "verify_time_s": 0.05, "mean_gamma": 3.0, "final_gamma": 3, "gamma": 3, "read_wait_per_round_s": 0.001,
           "auto_target_only": False, "verify_times_s": [0.0125] * 4, "batch": 1}
    two = {**one, "rounds": 2, "proposed": 4, "accepted": 4, "mean_gamma": 2.0, "final_gamma": 2,
           "verify_times_s": [0.025] * 2}
    stats = merged_stats([one, two], wall_s=1.0)
    assert stats["batch"] == 2 and stats["rounds"] == 6 and stats["acceptance_rate"] == 10 / 16
    assert stats["mean_gamma"] == pytest.approx((3 * 4 + 2 * 2) / 6) and stats["final_gamma"] == 2
    assert stats["host_overhead_per_round_s"] == pytest.approx((1.0 - 0.4 - 0.1) / 6)
    assert len(stats["verify_times_s"]) == 6
    assert merged_stats([one, {**two, "model_time_s": None}], 1.0)["host_overhead_per_round_s"] is None
    assert np.isclose(stats["tokens_per_s"], 20.0)


def test_float16_builder_folders_decode_on_the_cpu(tmp_path):
    """The builder's CUDA exports are float16: on the CPU they decode too, a batch prompt by prompt."""
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    target, draft = converted_self_pair(tmp_path, "float16", attention="gqa")
    decoder = SpeculativeDecoder(builder_folder(target, tmp_path / "bt"), builder_folder(draft, tmp_path / "bd"),
                                 device="cpu")
    args = dict(max_new_tokens=8, temperature=0, ignore_eos=True)
    out = decoder.generate(PROMPTS, gamma=3, method="greedy", **args)
    assert out.stats["loop"] == "host" and out.stats["one_prompt_at_a_time"]
    assert out.token_ids == [decoder.generate([p], gamma=0, method="target", **args).token_ids[0] for p in PROMPTS]


def test_logprobs_and_stop_strings_follow_each_request(decoder):
    args = dict(max_new_tokens=10, gamma=3, method="exact", temperature=1.0, ignore_eos=True, seed=5, logprobs=True)
    out = decoder.generate(PROMPTS, **args)
    assert [len(lp) for lp in out.logprobs] == [len(ids) for ids in out.token_ids]
    stop = out.texts[1][2:4]   # a piece of request 1's text: it stops there, the others need not
    cut = decoder.generate(PROMPTS, stop=[stop], **args)
    alone = decoder.generate([PROMPTS[1]], stop=[stop], **{**args, "seed": out.stats["seeds"][1]})
    assert cut.finish_reasons[1] == "stop" and cut.texts[1] == alone.texts[0]
    assert cut.logprobs[1] == alone.logprobs[0]
