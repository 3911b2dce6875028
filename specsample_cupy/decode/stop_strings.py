"""Stop strings: a request ends when its generated text contains one (generate(stop=[...])).

After each round the host has read, the text of every request that took tokens is searched for the
stop strings, only from where the last search of that request could not yet have seen a whole match
(so a stop string that spans rounds or token boundaries is found once, without rescanning the whole
text). The host does this on texts it decodes anyway; on the device loop it runs while the GPU works
on the next round, so it adds no synchronisation. A matched request is finished at once (the device
loop stops it from the next round it enqueues; tokens a round already in flight produced for it are
dropped), and its output is cut:

- text: everything before the first occurrence of the earliest-starting stop string;
- token_ids: the shortest prefix of the generated ids whose text contains a stop string (it ends with
  the token that completed it);
- finish_reason: "stop".
"""
from __future__ import annotations

import numpy as np


def check_stop_strings(stop) -> tuple[str, ...]:
    """A str or an iterable of str as a tuple of non-empty strings; TypeError/ValueError otherwise."""
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    for s in stops:
        if not isinstance(s, str):
            raise TypeError(f"stop strings must be str, got {type(s).__name__}")
        if not s:
            raise ValueError("a stop string must not be empty")
    return stops


def cut_text(text: str, stops) -> tuple[str, bool]:
    """(text before the earliest stop string, whether one was found)."""
    at = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text, False) if at < 0 else (text[:at], True)


class StopStrings:
    """The stop strings of one generate() call over `batch` requests."""

    def __init__(self, stops, tokenizer, batch: int):
        self.stops = tuple(stops)
        self.tokenizer = tokenizer
        self.reach = max(len(s) for s in self.stops) - 1   # characters a match may start before new text
        self.searched = [0] * batch                          # characters of each text searched, no match
        self.matched = np.zeros(batch, bool)

    def reset(self, b: int):
        """Row b starts a new request (continuous batching)."""
        self.searched[b], self.matched[b] = 0, False

    def _text(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def after_round(self, rnd, text_of) -> list[int]:
        """Requests to finish now: those that took tokens this round and whose text now holds a stop
        string. text_of(b): request b's text so far (the decoder's TextAssembler, which decodes each
        id once)."""
        rows = []
        for b in np.flatnonzero((rnd.taken > 0) & ~self.matched).tolist():
            text = text_of(b)
            start = max(0, self.searched[b] - self.reach)
            if any(s in text[start:] for s in self.stops):
                self.matched[b] = True
                rows.append(b)
            # The text's end may still change (an unfinished UTF-8 character): search it again.
            self.searched[b] = max(0, len(text) - 1)
        return rows

    def cut(self, texts: list[str], token_ids: list[list[int]]) -> None:
        """Cut the matched requests' texts and ids in place (module docstring)."""
        for b in np.flatnonzero(self.matched).tolist():
            texts[b], token_ids[b] = self.cut_row(token_ids[b])

    def cut_row(self, ids: list[int]) -> tuple[str, list[int]]:
        """A matched request's (text, token_ids), cut (module docstring)."""
        text, _ = cut_text(self._text(ids), self.stops)
        return text, ids[:self._shortest_match(ids)]

    def _shortest_match(self, ids) -> int:
        """The fewest leading ids whose text holds a stop string (len(ids) when none does)."""
        lo, hi = 1, len(ids)
        if not cut_text(self._text(ids), self.stops)[1]:
            return len(ids)
        while lo < hi:   # a prefix's text holding a stop string stays so when it grows
            mid = (lo + hi) // 2
            if cut_text(self._text(ids[:mid]), self.stops)[1]:
                hi = mid
            else:
                lo = mid + 1
        return lo
