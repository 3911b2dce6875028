"""generate(stop=...): stop strings across rounds and token boundaries, several requests stopping in
different rounds, the rest of the batch unaffected; the CLI's --stop."""
import json

import pytest
from click.testing import CliRunner

from specsample_cupy.decode.decoder import SpeculativeDecoder
from specsample_cupy.decode.stop_strings import check_stop_strings, cut_text

PROMPTS = ["def f(x):", "import os", "class A:"]
KW = dict(max_new_tokens=48, gamma=1, method="greedy", ignore_eos=True)   # gamma 1: at most 2 tokens a round


def _stop_inside(dec, text, ids, start):
    """A stop string that spans several tokens, starting inside the text at or after `start`."""
    for k in range(len(ids) - 4):
        head = dec.tokenizer.decode(ids[:k], skip_special_tokens=True)
        if len(head) >= start:
            span = dec.tokenizer.decode(ids[:k + 4], skip_special_tokens=True)[len(head) - 1:]
            if len(span) >= 4 and text.find(span) == len(head) - 1:
                return span
    pytest.skip("no multi-token span found")


def _check(device):
    dec = SpeculativeDecoder(device=device)
    full = dec.generate(PROMPTS, **KW)
    # Request 0 stops early, request 1 late; request 2's text holds neither string.
    stop0 = _stop_inside(dec, full.texts[0], full.token_ids[0], 5)
    stop1 = _stop_inside(dec, full.texts[1], full.token_ids[1], 40)
    stops = [stop0, stop1]
    if any(s in full.texts[2] for s in stops) or stop1 in full.texts[0][:full.texts[0].find(stop0)]:
        pytest.skip("stop strings not specific to their requests")
    out = dec.generate(PROMPTS, stop=stops, **KW)
    for b in (0, 1):
        cut = min(i for i in (full.texts[b].find(s) for s in stops) if i >= 0)
        assert out.texts[b] == full.texts[b][:cut] and out.finish_reasons[b] == "stop"
        ids = out.token_ids[b]
        assert ids == full.token_ids[b][:len(ids)]
        text_ids = dec.tokenizer.decode(ids, skip_special_tokens=True)
        assert any(s in text_ids for s in stops)                                   # it completed a stop string
        assert not any(s in dec.tokenizer.decode(ids[:-1], skip_special_tokens=True) for s in stops)   # shortest
    assert len(out.token_ids[0]) < len(out.token_ids[1])                          # stopped in different rounds
    assert out.texts[2] == full.texts[2] and out.token_ids[2] == full.token_ids[2]
    assert out.finish_reasons[2] == "length"
    return out


def test_stop_strings_on_the_cpu():
    out = _check("cpu")
    assert out.stats["loop"] == "host"


@pytest.mark.gpu
def test_stop_strings_on_the_device_loop():
    out = _check("cuda")
    assert out.stats["loop"] == "device"


def test_stop_string_arguments_and_cutting():
    assert check_stop_strings("ab") == ("ab",) and check_stop_strings(None) == ()
    with pytest.raises(ValueError, match="empty"):
        check_stop_strings(["x", ""])
    with pytest.raises(TypeError):
        check_stop_strings([3])
    assert cut_text("abcXYdefZ", ("Z", "XY")) == ("abc", True)
    assert cut_text("abc", ("Z",)) == ("abc", False)


def test_cli_stop_cuts_text_and_reports_stop(pair):
    from specsample_cupy.cli.decode import decode
    args = ["--target", pair[0], "--draft", pair[1], "--prompt", "a", "--max-new-tokens", "30",
            "--method", "greedy", "--json"]
    full = json.loads(CliRunner().invoke(decode, args).stdout)
    text = full["texts"][0]
    if len(text) < 6:
        pytest.skip("too little text")
    stop = text[3:6]
    out = json.loads(CliRunner().invoke(decode, args + ["--stop", stop]).stdout)
    assert out["texts"][0] == text[:text.find(stop)] and out["finish_reasons"] == ["stop"]
