"""Each request's text, assembled while it is generated.

With device rounds the host waits for the GPU during most of a round, so decoding a request's new
tokens then costs no wall time, where decoding every text after the last round does. Pieces can be
decoded separately and joined only where that equals decoding the whole: for a byte-level BPE
decoder (GPT-2 style: tokens map to bytes, the bytes are read as UTF-8) the text of a+b is the text
of a plus the text of b whenever a's bytes end on a character boundary, which is when a's text does
not end in U+FFFD (an unfinished character decodes to one). Tokens that leave a piece unfinished
wait for the next ones. Other decoders (WordPiece's "##", Metaspace's leading space) do not split
this way, so their texts are decoded whole, when the request finishes.
"""
from __future__ import annotations

REPLACEMENT = "\ufffd"


def splits_at_characters(tokenizer) -> bool:
    """Whether the tokenizer's decoder is the byte-level one, whose texts may be decoded in pieces."""
    return type(tokenizer.decoder).__name__ == "ByteLevel"


class TextAssembler:
    """Texts of `batch` requests from their ids, given as they are generated (add), skipping special
    tokens; incremental=True decodes pieces as they come where the tokenizer allows it, else each
    request is decoded whole by text()."""

    def __init__(self, tokenizer, batch: int, incremental: bool):
        self.tokenizer = tokenizer
        self.incremental = incremental and splits_at_characters(tokenizer)
        self._done = [""] * batch            # text of the ids decoded so far
        self._pending = [[] for _ in range(batch)]   # ids not yet decoded
        self._final = [None] * batch

    def reset(self, b: int):
        """Row b starts a new request (continuous batching)."""
        self._done[b], self._pending[b], self._final[b] = "", [], None

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, b: int, ids: list[int]):
        """Request b's next generated ids."""
        pending = self._pending[b]
        pending.extend(ids)
        if self.incremental and pending:
            piece = self._decode(pending)
            if not piece.endswith(REPLACEMENT):
                self._done[b] += piece
                pending.clear()

    def current(self, b: int) -> str:
        """Request b's text so far (decoding only the ids not yet decoded in a piece)."""
        if self._final[b] is not None:
            return self._final[b]
        pending = self._pending[b]
        return self._done[b] + (self._decode(pending) if pending else "")

    def text(self, b: int) -> str:
        """Request b's text (call once it has all its ids; later calls return the same text)."""
        if self._final[b] is None:
            pending = self._pending[b]
            self._final[b] = self._done[b] + (self._decode(pending) if pending else "")
        return self._final[b]
