"""The device loop's proposers: the two kinds of proposers.py (a draft model, prompt lookup), each
enqueuing a round's drafts on the loop's stream with no host round trip, behind one method:

    draft_logits = proposer.enqueue(rounds, base, gamma, target_step, draft_tokens)

It writes draft_tokens [B, gamma] int32 and the round buffers' draft lengths, leaves the target's
feed (target_step.feed: the last emitted token and the drafts) written for the target's run, and
returns the drafts' logits [B, gamma, V] for verify(), or None for one-hot drafts. `rounds` is the
DeviceRounds of the call (its buffers, stream, caches and temperature); `base` the round's first
random-number offset.
"""
from __future__ import annotations

from specsample_cupy.decode.ngram import propose_ngram_device
from specsample_cupy.decode.round_buffers import THREADS


class DraftModelDeviceProposer:
    """gamma captured draft runs; after each, step_done samples the next draft token on the device
    and writes the next run's feed (the last run's: the target's). The first run of a round catches
    up on the tokens the draft has not seen (draft_steps[0], S = 2)."""

    def enqueue(self, rounds, base: int, gamma: int, target_step, draft_tokens):
        buf, stream, cache = rounds.buf, rounds.stream, rounds.dc
        for i in range(gamma):
            launch = buf.step_launches[i]
            step = buf.draft_steps[min(i, 1)]
            L = cache.length
            rounds.draft.replay(step)
            cache.length += step.steps
            if buf.truncation is not None:   # drafts come from the truncated draft distribution
                buf.row_warps(stream, step.logits.data.ptr, step.steps, rounds.temperature, buf.truncation)
            last = i == gamma - 1
            buf.set_commit(launch.commit, step.steps, L)
            launch(stream, offset=(base + i) & 0xFFFFFFFF, L_run=L, G=gamma, next_is_target=int(last),
                   next_feed=(target_step if last else buf.draft_steps[1]).feed.data.ptr)
        B, vocab = rounds.B, buf.V
        return buf.draft_logits[:B * gamma * vocab].reshape(B, gamma, vocab)


class NgramDeviceProposer:
    """Prompt lookup on the device's sequences (ngram.propose_ngram_device), then the target's feed;
    one-hot drafts (verify() reads no draft rows)."""

    def __init__(self, ngram: tuple[int, int]):
        self.ngram_min, self.ngram_max = ngram

    def enqueue(self, rounds, base: int, gamma: int, target_step, draft_tokens):
        buf, dev, B = rounds.buf, rounds.buf.dev, rounds.B
        propose_ngram_device(dev["seq"].reshape(B, buf.P), dev["seq_len"], dev["finished"], dev["limit"],
                             dev["eos"], draft_tokens, buf.draft_len, gamma=gamma, ngram_min=self.ngram_min,
                             ngram_max=self.ngram_max, limit_is_end=True)
        buf.ngram_feed_launch(rounds.stream, B, THREADS, G=gamma, feed=target_step.feed.data.ptr)
        return None


def device_proposer(dec):
    """The device loop's proposer for decoder `dec`: its draft model's, or prompt lookup's (draft="ngram")."""
    return NgramDeviceProposer(dec.ngram) if dec.draft is None else DraftModelDeviceProposer()
