"""pinned.PinnedRing: uploads enqueued behind long work arrive intact, slots grow, and a slot is
handed out again only after its copy ran."""
import numpy as np
import pytest

from specsample_cupy.runtime.pinned import MIN_SLOT_BYTES, PinnedRing


def _busy(cp, stream, ms: float = 20.0):
    """Hold `stream` for about ms milliseconds (a spinning kernel), so later copies queue behind it."""
    spin = cp.RawKernel(r'''extern "C" __global__ void spin(long long cycles) {
        long long start = clock64(); while (clock64() - start < cycles) {} }''', "spin")
    rate = cp.cuda.Device().attributes["ClockRate"]   # kHz
    with stream:
        spin((1,), (1,), (np.int64(ms * rate),))


@pytest.mark.gpu
def test_uploads_behind_busy_work_keep_their_values():
    import cupy as cp
    stream = cp.cuda.Stream(non_blocking=True)
    ring = PinnedRing(3)
    _busy(cp, stream)
    # More uploads than slots while the stream is held: the ring must wait for a slot's copy before
    # refilling its host bytes, and every device view must still hold its own values at the end.
    sent, copies = [], []
    for k in range(7):
        values = np.arange(k, k + 5 + 300 * k, dtype=np.int64) * (k + 1)   # grows past MIN_SLOT_BYTES
        up = ring.upload(values, stream)
        with stream:
            copies.append(up.copy())   # read in stream order, before the slot comes round again
        sent.append(values)
    stream.synchronize()
    assert sent[-1].nbytes > MIN_SLOT_BYTES
    for values, copy in zip(sent, copies):
        assert copy.dtype == values.dtype and copy.shape == values.shape
        np.testing.assert_array_equal(cp.asnumpy(copy), values)


@pytest.mark.gpu
def test_take_and_send_copy_into_a_given_buffer():
    import cupy as cp
    stream = cp.cuda.Stream(non_blocking=True)
    ring = PinnedRing(2)
    dst = cp.zeros(16, cp.int32)
    _busy(cp, stream, 5.0)
    slot, host = ring.take(dst.nbytes)
    host[:dst.nbytes] = np.arange(16, dtype=np.int32).view(np.uint8)
    ring.send(slot, dst.data.ptr, dst.nbytes, stream)
    stream.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(dst), np.arange(16))
