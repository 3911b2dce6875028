"""The KV cache of one decoder for a batch: preallocated buffers, a host-side slot mask, rollback."""
from __future__ import annotations

import contextlib

import numpy as np


def buffer_ptr(array) -> int:
    """Address of an array's first element: CuPy device pointer or NumPy host pointer."""
    return array.data.ptr if hasattr(array.data, "ptr") else array.ctypes.data


class KVCache:
    """Keys and values of one model for B rows, stored as `length` columns (slots) per row.

    mask [B, length] (host, int64) is 1 where slot j of row b holds a real token and 0 for a hole
    (left padding, a rejected draft, a column fed while the row was finished). The attention mask fed
    to the model is this mask, so holes are invisible to attention; position ids are given explicitly,
    so they do not shift the positions of later tokens. Invariant kept by the decoder: the real slots of
    row b hold, in order, the first n_real[b] tokens of that row's sequence.

    Storage: two flat buffers, each with one row per cache tensor (key, value of every layer) whose first
    B*H*length*D elements are that tensor's contiguous [B, H, length, D] block. A model run reads the past
    from one and writes past+new (the graph's Concat) into the other, so they swap after every run.

    Rollback keeps each row's first keep[b] real tokens by turning its later slots into holes: a mask
    update on the host and no device work. Holes cost attention work and capacity, so once more than
    `slack` columns are unused by every row, or a run would not fit, compact() gathers each row's real
    slots, right-aligned, into the other buffer: one device-to-device copy for all layers.
    """

    def __init__(self, xp, n_tensors, batch, n_heads, head_dim, dtype, capacity, *, slack=32, stream=None,
                 buffers=None):
        self.xp, self.stream = xp, stream
        self.n_tensors, self.batch, self.n_heads, self.head_dim = n_tensors, batch, n_heads, head_dim
        self.capacity, self.slack = int(capacity), int(slack)
        per_tensor = batch * n_heads * self.capacity * head_dim
        if buffers is None:
            with self._on_stream():
                buffers = [xp.zeros((n_tensors, per_tensor), dtype) for _ in range(2)]
        self._buffers = buffers
        self._current = 0
        self.length = 0
        self.mask = np.zeros((batch, 0), np.int64)
        self.compactions = 0

    def _on_stream(self):
        return self.stream if self.stream is not None else contextlib.nullcontext()

    @property
    def n_real(self) -> np.ndarray:
        """[B] number of real tokens each row holds."""
        return self.mask.sum(axis=1)

    def _blocks(self, which: int, length: int):
        """All cache tensors of buffer `which` as one [n_tensors, B, H, length, D] view (no copy)."""
        buf = self._buffers[which]
        item = buf.itemsize
        shape = (self.n_tensors, self.batch, self.n_heads, length, self.head_dim)
        strides = (buf.strides[0], self.n_heads * length * self.head_dim * item,
                   length * self.head_dim * item, self.head_dim * item, item)
        return self.xp.lib.stride_tricks.as_strided(buf, shape=shape, strides=strides)

    def _tensors(self, which: int, length: int):
        """Each cache tensor of buffer `which` as a contiguous [B, H, length, D] view at its row's start
        (as_strided keeps that address even for an empty past, which reshape may not)."""
        blocks = self._blocks(which, length)
        return [blocks[t] for t in range(self.n_tensors)]

    def past(self):
        """The cache tensors as the model's past inputs: [B, H, length, D] each."""
        return self._tensors(self._current, self.length)

    def present(self, steps: int):
        """Where the model writes its present outputs for `steps` new columns: [B, H, length+steps, D] each."""
        return self._tensors(1 - self._current, self.length + steps)

    def advance(self, new_mask: np.ndarray):
        """Record a run that appended new_mask.shape[1] columns (its present outputs are now the cache)."""
        self._current = 1 - self._current
        self.length += new_mask.shape[1]
        self.mask = np.concatenate([self.mask, new_mask.astype(np.int64)], axis=1)

    def make_room(self, steps: int):
        if self.length + steps > self.capacity:
            self.compact()
        if self.length + steps > self.capacity:
            raise RuntimeError(f"KV cache full: {self.length} columns in use, {steps} more needed, "
                               f"capacity {self.capacity}")

    def rollback(self, keep: np.ndarray):
        """Keep the first keep[b] real tokens of each row (no-op for rows holding fewer)."""
        n_real = self.n_real
        keep = np.minimum(n_real, np.asarray(keep))
        if (keep < n_real).any():
            self.mask = self.mask * (np.cumsum(self.mask, axis=1) <= keep[:, None])
        if self.length - int(keep.max(initial=0)) > self.slack:
            self.compact()

    def reset_rows(self, rows) -> None:
        """Rows that start over (continuous batching: a new request in a finished request's row): all
        their slots become holes."""
        self.mask[np.asarray(rows, np.int64)] = 0
        if self.length - int(self.n_real.max(initial=0)) > self.slack:
            self.compact()

    def take_rows(self, rows, other: "KVCache") -> None:
        """Row rows[k] takes the real slots of row k of `other` (a cache of the same model), in order
        and right-aligned; its own slots become holes. Continuous batching prefills newcomers in a
        small cache of their own, so the other rows' holes cost that prefill nothing, then moves
        them in. The cache grows (left holes for every row) when it is shorter than a row it takes."""
        rows = np.asarray(rows, np.int64)
        real = [np.flatnonzero(other.mask[k]) for k in range(len(rows))]
        self._grow(max((len(cols) for cols in real), default=0))
        src = other._blocks(other._current, other.length)
        dst = self._blocks(self._current, self.length)
        with self._on_stream():
            for k, (b, cols) in enumerate(zip(rows.tolist(), real)):
                start = self.length - len(cols)
                if len(cols):
                    dst[:, b, :, start:] = src[:, k][:, :, self.xp.asarray(cols)]
                self.mask[b] = 0
                self.mask[b, start:] = 1

    def _grow(self, length: int) -> None:
        """At least `length` columns: the slots move right into the other buffer, holes before them."""
        if length <= self.length:
            return
        if length > self.capacity:
            raise RuntimeError(f"KV cache full: {length} columns needed, capacity {self.capacity}")
        with self._on_stream():
            dst = self._blocks(1 - self._current, length)
            dst[:, :, :, :length - self.length] = 0
            dst[:, :, :, length - self.length:] = self._blocks(self._current, self.length)
        self.mask = np.pad(self.mask, ((0, 0), (length - self.length, 0)))
        self._current, self.length = 1 - self._current, length

    def compact(self):
        """Move each row's real slots, in order and right-aligned, to the front of the other buffer."""
        new_length = int(self.n_real.max(initial=0))
        # A stable argsort of the 0/1 mask lists each row's holes, then its real slots in order; the
        # last new_length entries are the row's real slots preceded by (harmless, masked) hole slots.
        cols = np.argsort(self.mask, axis=1, kind="stable")[:, self.length - new_length:]
        new_mask = np.take_along_axis(self.mask, cols, axis=1)
        if new_length == self.length and (cols == np.arange(new_length)).all():
            self.mask = new_mask
            return
        xp = self.xp
        with self._on_stream():
            src = self._blocks(self._current, self.length)
            dst = self._blocks(1 - self._current, new_length)
            rows = xp.arange(self.batch)[:, None]
            # Advanced indices on axes 1 and 3 put the broadcast [B, new_length] axes first.
            dst[...] = src[:, rows, :, xp.asarray(cols)].transpose(2, 0, 3, 1, 4)
        self._current = 1 - self._current
        self.length = new_length
        self.mask = new_mask
        self.compactions += 1
