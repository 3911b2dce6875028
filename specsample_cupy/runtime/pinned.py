"""Page-locked host memory for the small host-to-device copies the decode loops enqueue.

A copy from pageable memory may wait for the stream's earlier work (the driver stages it through
memory of its own), so a host that enqueues rounds ahead of the GPU would stall on it; a copy from
page-locked memory is truly asynchronous. Its host bytes must then stay unchanged until the copy has
run: a PinnedRing hands out its slots in turn, records an event after each slot's copy, and waits for
that event before handing the slot out again (at once, unless the GPU is a whole ring behind).

Device memory is another matter: a slot's device twin (upload()) is rewritten only by a later copy on
the same stream, which runs after every kernel enqueued before it, so the work that reads an upload
needs no event of its own. Every copy of one ring goes to one stream (the decoder's).
"""
from __future__ import annotations

import numpy as np

MIN_SLOT_BYTES = 4096
_H2D = 1   # cudaMemcpyKind


def host_array(shape, dtype) -> np.ndarray:
    """A NumPy array over new page-locked host memory (which the array keeps alive). With unified
    addressing its address is valid on the device too: kernels may write it directly."""
    import cupy
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    return np.frombuffer(cupy.cuda.alloc_pinned_memory(max(n, 1) * dtype.itemsize), dtype, n).reshape(shape)


class PinnedRing:
    """`slots` page-locked host buffers (and device twins, for upload()), grown on demand."""

    def __init__(self, slots: int):
        self._host = [None] * slots     # uint8 views of page-locked memory
        self._device = [None] * slots   # cupy uint8 arrays: upload()'s destinations
        self._events = [None] * slots   # recorded after each slot's last copy
        self._next = 0

    def take(self, nbytes: int) -> tuple[int, np.ndarray]:
        """(slot, uint8 host buffer of at least nbytes) whose previous copy has run; fill it, then send()."""
        i = self._next
        self._next = (i + 1) % len(self._host)
        if self._events[i] is not None:
            self._events[i].synchronize()
        if self._host[i] is None or self._host[i].nbytes < nbytes:
            size = max(nbytes, MIN_SLOT_BYTES)
            self._host[i] = host_array(size, np.uint8)
        return i, self._host[i]

    def send(self, slot: int, dst_ptr: int, nbytes: int, stream) -> None:
        """Enqueue the copy of the slot's first nbytes to device address dst_ptr on `stream`."""
        import cupy
        cupy.cuda.runtime.memcpyAsync(dst_ptr, self._host[slot].ctypes.data, nbytes, _H2D, stream.ptr)
        if self._events[slot] is None:
            self._events[slot] = cupy.cuda.Event(disable_timing=True)
        self._events[slot].record(stream)

    def upload(self, values: np.ndarray, stream, out=None):
        """`values` on the device (same dtype and shape) for the work enqueued after this on `stream`:
        copied into `out` (a C-contiguous CuPy array of as many bytes) when given, for arrays that
        must outlive the ring's turn; else a view of the slot's device twin, valid until the ring
        comes round to the slot again."""
        import cupy
        values = np.ascontiguousarray(values)
        i, host = self.take(values.nbytes)
        host[:values.nbytes] = values.view(np.uint8).ravel()
        if out is not None:
            if out.nbytes != values.nbytes or not out.flags.c_contiguous:
                raise ValueError(f"out must be a C-contiguous array of {values.nbytes} bytes")
            self.send(i, out.data.ptr, values.nbytes, stream)
            return out
        if self._device[i] is None or self._device[i].nbytes < host.nbytes:
            with stream:   # CuPy's pool hands the memory out again only in this stream's order
                self._device[i] = cupy.empty(host.nbytes, cupy.uint8)
        self.send(i, self._device[i].data.ptr, values.nbytes, stream)
        return self._device[i][:values.nbytes].view(values.dtype).reshape(values.shape)
