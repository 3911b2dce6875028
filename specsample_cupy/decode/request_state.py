"""The host's view of a batch of requests: each row's tokens, budget, and why it finished.

Both decode loops keep it: the host loop (host_loop) decides each round's appends here, the
device loop (device_loop) decides them on the GPU with the same rules and the host applies them
with take(). Shapes: seq [B, P] int64 (prompt then generated tokens, left-aligned, pad after),
seq_len, prompt_len, budget [B] int64, finished [B] bool.
"""
from __future__ import annotations

import numpy as np

FINISH_REASONS = ("length", "eos", "context", "stop")


class Requests:
    """Host-side state of a batch: each row's sequence (prompt then generated tokens, left-aligned),
    its token budget, and whether it has finished (EOS or budget)."""

    def __init__(self, prompt_ids: list[list[int]], budgets: np.ndarray, pad_id: int, eos_ids, extra: int,
                 max_new_tokens: int | None = None):
        """budgets [B]: tokens each row may generate (max_new_tokens, or less where the context ends
        first); eos_ids: the ids that end a row (empty: none do); extra: spare columns past the
        longest row, for a round's tokens beyond a budget."""
        self.batch = len(prompt_ids)
        self.max_new_tokens = int(budgets.max(initial=0)) if max_new_tokens is None else max_new_tokens
        self.requested = np.full(self.batch, self.max_new_tokens, np.int64)   # each row's max_new_tokens
        self.stopped = np.zeros(self.batch, bool)   # finished by stop() (a stop string), not by a rule
        self.prompt_len = np.array([len(p) for p in prompt_ids], np.int64)
        self.seq = np.full((self.batch, int((self.prompt_len + budgets).max()) + extra), pad_id, np.int64)
        for b, ids in enumerate(prompt_ids):
            self.seq[b, :len(ids)] = ids
        self.seq_len = self.prompt_len.copy()
        self.budget = budgets.astype(np.int64)
        self.finished = self.budget <= 0
        self.pad_id, self.eos_ids = pad_id, np.array(sorted(eos_ids), np.int64)
        self._eos_set = {int(t) for t in eos_ids}
        self.extra = extra

    def refill(self, b: int, prompt_ids: list[int], budget: int, max_new_tokens: int) -> None:
        """Row b starts a new request (continuous batching): its prompt, its budget (see __init__) and
        its max_new_tokens (what finish_reason() calls "length"). The sequences widen when it needs
        more columns than any row so far."""
        self.widen(len(prompt_ids) + budget + self.extra)
        self.seq[b] = self.pad_id
        self.seq[b, :len(prompt_ids)] = prompt_ids
        self.prompt_len[b] = self.seq_len[b] = len(prompt_ids)
        self.budget[b], self.requested[b] = budget, max_new_tokens
        self.finished[b] = budget <= 0
        self.stopped[b] = False

    def widen(self, width: int) -> None:
        """At least `width` columns per row (pad columns added on the right)."""
        if width > self.seq.shape[1]:
            self.seq = np.pad(self.seq, ((0, 0), (0, width - self.seq.shape[1])), constant_values=self.pad_id)

    @property
    def remaining(self) -> np.ndarray:
        return self.budget - (self.seq_len - self.prompt_len)

    def last_tokens(self) -> np.ndarray:
        return self.seq[np.arange(self.batch), self.seq_len - 1]

    def prefill_chunks(self, n_cached: np.ndarray, chunk: int, only=None):
        """The columns (columns()) of each prefill run: row b's tokens from n_cached[b] up to all but
        its last, at most `chunk` per run, for the rows `only` ([B] bool; default all)."""
        n_cached = np.array(n_cached, np.int64)
        while True:
            upto = np.minimum(self.seq_len - 1, n_cached + chunk)
            rows = upto > n_cached if only is None else (upto > n_cached) & only
            if not rows.any():
                return
            yield self.columns(n_cached, upto, rows=rows)
            n_cached = np.where(rows, upto, n_cached)

    def columns(self, n_cached: np.ndarray, upto: np.ndarray, rows: np.ndarray):
        """Input columns that feed row b its tokens seq[b, n_cached[b]:upto[b]] (rows where `rows` is set),
        right-aligned like left padding; other slots are holes. Returns host (ids, mask, positions) [B, S]."""
        need = np.where(rows, upto - n_cached, 0)
        steps = max(int(need.max(initial=0)), 1)
        src = upto[:, None] - steps + np.arange(steps)[None, :]   # index in the sequence of each column
        mask = rows[:, None] & (src >= n_cached[:, None])
        src = np.clip(src, 0, None)
        ids = np.where(mask, self.seq[np.arange(self.batch)[:, None], src], self.pad_id)
        return ids, mask, src

    def append(self, tokens: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Append the first counts[b] of tokens[b] to unfinished rows, stopping after an EOS or at the budget.
        Returns how many tokens each row took."""
        if self.batch <= 16:
            return self._append_rows(tokens, counts)
        k = np.arange(tokens.shape[1])[None, :]
        valid = (k < np.where(self.finished, 0, counts)[:, None])
        is_eos = valid & np.isin(tokens, self.eos_ids)
        upto_eos = np.where(is_eos.any(axis=1), is_eos.argmax(axis=1) + 1, valid.sum(axis=1))
        n_new = np.minimum(upto_eos, self.remaining)
        take = k < n_new[:, None]
        rows, cols = np.nonzero(take)
        self.seq[rows, self.seq_len[rows] + cols] = tokens[rows, cols]
        self.seq_len += n_new
        self.finished |= (is_eos & take).any(axis=1) | (self.remaining <= 0)
        return n_new

    def _append_rows(self, tokens: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """append() one row at a time: for a few rows, plain Python beats a dozen NumPy calls (this runs
        between a round's read and the next round's first launch, while the GPU waits)."""
        eos = self._eos_set
        remaining = (self.budget - (self.seq_len - self.prompt_len)).tolist()
        n_new = np.zeros(self.batch, np.int64)
        for b, count in enumerate(np.asarray(counts).tolist()):
            if self.finished[b]:
                continue
            row = tokens[b, :max(min(count, remaining[b]), 0)].tolist()
            n = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
            if n:
                start = int(self.seq_len[b])
                self.seq[b, start:start + n] = row[:n]
                self.seq_len[b] += n
                n_new[b] = n
            if (n and row[n - 1] in eos) or remaining[b] - n <= 0:
                self.finished[b] = True
        return n_new

    def draft_lengths(self, gamma: int) -> np.ndarray:
        """Drafts each row proposes this round: no more than it may still emit beyond the round's
        corrected token; 0 for finished rows."""
        return np.where(self.finished, 0, np.minimum(gamma, self.remaining - 1))

    def take(self, tokens: np.ndarray, taken: np.ndarray, finished: np.ndarray) -> np.ndarray:
        """Apply decisions made elsewhere (device_loop's round_done, which follows append()'s rules):
        row b takes tokens[b, :taken[b]]; `finished` is the new finished flags. Rows the host stopped
        (stop()) take nothing more and stay finished, whatever the device still did for them."""
        taken = np.where(self.stopped, 0, taken)
        finished = np.asarray(finished, bool) | self.stopped
        for b in np.flatnonzero(taken):
            start, n = int(self.seq_len[b]), int(taken[b])
            self.seq[b, start:start + n] = tokens[b, :n]
        self.seq_len += taken
        self.finished = np.asarray(finished, bool).copy()
        return taken

    def generated(self, b: int) -> list[int]:
        return self.seq[b, self.prompt_len[b]:self.seq_len[b]].tolist()

    def stop(self, rows) -> None:
        """Finish these rows now (a caller's reason, e.g. a stop string); their reason is "stop"."""
        rows = np.asarray(rows, np.int64)
        self.stopped[rows] |= ~self.finished[rows]
        self.finished[rows] = True

    def finish_reason(self, b: int) -> str:
        """Why row b ended: "stop" (stop()), "eos", "length" (max_new_tokens generated) or "context"
        (the models' context ended first)."""
        n = int(self.seq_len[b] - self.prompt_len[b])
        if self.stopped[b]:
            return "stop"
        if n and int(self.seq[b, self.seq_len[b] - 1]) in self._eos_set:
            return "eos"
        return "length" if n >= self.requested[b] else "context"
