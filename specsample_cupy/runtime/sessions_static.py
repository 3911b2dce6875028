"""Decoder runs with fixed bindings, captured as CUDA graphs by ONNX Runtime (device="cuda").

A run whose inputs and outputs keep their shapes and addresses can be captured once and replayed:
ONNX Runtime then enqueues the whole model with one graph launch, about 15 µs of host time instead
of 0.7-1.1 ms for the embedded pair (benchmarks/NOTES.md, "Decode loop: host time per round"). The
shapes stay fixed when the past is always the cache's full capacity C, its unused slots masked:

    past_key_values.*  [B, H, C, D]      the cache buffer itself (one buffer, never swapped)
    attention_mask     [B, C + S]        the cache's slot mask, then the S new columns'
    present.*          [B, H, C + S, D]  a scratch buffer; after the run its last S columns are
                                         copied to the cache's first free slot (one 2-D copy)

Attention over masked slots gives them exactly zero weight, and keys carry their positions (the
position_ids input), so where a column sits in the cache does not change the result.

One binding, and one captured graph, per step count S <= MAX_GRAPH_STEPS: 1 for the draft's steps,
gamma + 1 for the target's. The int64 feeds go from a pinned host ring to the device in one
asynchronous copy per run. Longer runs (prefill chunks) are bound afresh and not captured.
Prefill runs (forward(prefill=True): every prompt but its last token, whose logits nobody reads) keep
a binding and graph per S too, but all write their logits to one [B, MAX_GRAPH_STEPS, V] buffer of the
plan: a binding of its own per S would keep up to 528 B V logits for a plan that has prefilled every
short length (20 GB of float32 at B = 64, V = 151936, as continuous batching's newcomers can).
ONNX Runtime keeps every captured graph for the session's lifetime, so buffers are planned per
(batch, capacity rounded up to CAPACITY_ROUND) and reused by later generate() calls of that size.

Capturing needs a graph without CPU nodes (no shape arithmetic), as models/export_onnx.py writes: for
other exports ONNX Runtime refuses to create a capturing session. Such a model still runs with the
same fixed bindings, each run enqueued by ONNX Runtime without a graph (capture=False): more host time
per run, but the same buffers, so the device loop (decode/device_loop.py) drives it like any other.
Models without a position_ids input, or with a use_cache_branch input, cannot take a cache with
holes; the decoder uses sessions.DecoderSession for them.

A model of the GroupQueryAttention layout (convert(attention="gqa"), session.shared_buffer) takes no
holes either, but its own way: past and present are bound to the same cache buffer, and a run writes
its S new columns at each row's token count (the attention mask's row sums, the slot mask's real
slots plus the S new columns, which are then all real: decode_round.cu's dense columns), rotary at
the positions those counts give. So there is no scratch and no commit copy; a compaction moves only
the mask (any arrangement of a row's real slots says the same count); total_sequence_length is the
capacity, on the host. ONNX Runtime runs several new tokens over a past at batch 1 only, so such a
model decodes one sequence at a time (new_cache() refuses more).
"""
from __future__ import annotations

import ctypes
import functools
import itertools

import numpy as np

from specsample_cupy.runtime import kernel_runtime
from specsample_cupy.runtime.model_folder import ModelSpec
from specsample_cupy.runtime.ort_session import run_options
from specsample_cupy.runtime.pinned import PinnedRing
from specsample_cupy.runtime.sessions import DecoderSession
from specsample_cupy.runtime.sessions_cache import KVCache

MAX_GRAPH_STEPS = 32      # runs of more columns are not captured
CAPACITY_ROUND = 64       # capacities are rounded up so that repeated generate() calls share plans
MAX_PLANS = 4             # (batch, capacity) plans kept per session, each with its buffers and graphs
RING_SLOTS = 64           # pinned feed slots; a slot is reused only after its copy has completed

_D2D = 3                  # cudaMemcpyKind


class _WidenIds:
    """kernels_cu/feeds.cu's widen_ids through a kernel_runtime.Launch (a few µs of host time, against
    ~15 for an elementwise CuPy assignment): int32 draft tokens into int64 ids. One per device, shared
    by every session and thread (the Launch serialises their calls)."""

    def __init__(self):
        kernel, = kernel_runtime.functions("feeds.cu", ("widen_ids",))
        c = ctypes
        self.launch = kernel_runtime.Launch(kernel, [c.c_void_p(), c.c_int32(), c.c_void_p(), c.c_int32(),
                                                     c.c_int32(), c.c_int32(), c.c_int32()])

    def __call__(self, src, dst, vocab: int, stream):
        """dst [B, k] int64 = src [B, k] int32; both with unit column stride, any row pitch."""
        rows, cols = src.shape
        self.launch(stream, -(-(rows * cols) // 128), 128,
                    leading=(src.data.ptr, src.strides[0] // 4, dst.data.ptr, dst.strides[0] // 8, rows, cols, vocab))


@functools.lru_cache(maxsize=None)
def _widen_ids(device_id: int) -> _WidenIds:
    return _WidenIds()


def _copy_columns(dst, dst_col: int, src, src_col: int, cols: int, stream) -> None:
    """dst[:, dst_col:dst_col + cols] = src[:, src_col:src_col + cols] for 2-D arrays of one dtype with
    contiguous rows: one 2-D copy on `stream` (a few µs of host time, against tens for a CuPy copy)."""
    import cupy
    if not (dst.flags.c_contiguous and src.flags.c_contiguous):
        dst[:, dst_col:dst_col + cols] = src[:, src_col:src_col + cols]
        return
    item = dst.itemsize
    cupy.cuda.runtime.memcpy2DAsync(dst.data.ptr + dst_col * item, dst.shape[1] * item,
                                    src.data.ptr + src_col * item, src.shape[1] * item,
                                    cols * item, dst.shape[0], _D2D, stream.ptr)


class StaticKVCache(KVCache):
    """KVCache over one fixed buffer whose full capacity is the model's past: new columns are copied in
    (commit), holes stay until the buffer is full, and compaction happens in place."""

    def __init__(self, session: "StaticDecoderSession", plan: "_Plan"):
        super().__init__(session.xp, len(session.cache_names), plan.batch, session.n_kv_heads, session.head_dim,
                         session.kv_dtype, plan.capacity, slack=plan.capacity, stream=session.stream,
                         buffers=[plan.cache])
        # A shared buffer's keys and values sit at each row's count: a compaction moves none.
        self.shared = getattr(session, "shared_buffer", False)

    def past(self):
        return self._tensors(0, self.capacity)

    def present(self, steps: int):
        raise NotImplementedError("a static cache takes new columns through StaticDecoderSession.forward")

    def advance(self, new_mask: np.ndarray):
        self.length += new_mask.shape[1]
        self.mask = np.concatenate([self.mask, new_mask.astype(np.int64)], axis=1)

    def compact(self):
        new_length = int(self.n_real.max(initial=0))
        cols = np.argsort(self.mask, axis=1, kind="stable")[:, self.length - new_length:]
        new_mask = np.take_along_axis(self.mask, cols, axis=1)
        if not (new_length == self.length and (cols == np.arange(new_length)).all()):
            self.gather(self.xp.asarray(cols))
        self.length, self.mask = new_length, new_mask

    def gather(self, cols):
        """Slot j of row b takes slot cols[b, j] (cols: [B, new_length] on the device), for j < new_length;
        the caller sets length and mask."""
        if self.shared:
            self.compactions += 1
            return
        xp = self.xp
        with self._on_stream():
            blocks = self._blocks(0, self.capacity)
            rows = xp.arange(self.batch)[:, None]
            gathered = blocks[:, rows, :, cols].transpose(2, 0, 3, 1, 4)   # a copy
            blocks[:, :, :, :cols.shape[1]] = gathered
        self.compactions += 1


class _Step:
    """Buffers and IOBinding of runs with S new columns, bound once; graph_id -1 means not captured."""

    def __init__(self, session: "StaticDecoderSession", plan: "_Plan", steps: int, graph_id: int, scratch,
                 logits=None):
        import cupy
        B, C, S = plan.batch, plan.capacity, steps
        self.steps, self.graph_id = S, graph_id
        self.feed = cupy.empty(2 * B * S + B * (C + S), cupy.int64)   # ids | positions | mask
        self.ids = self.feed[:B * S].reshape(B, S)
        # Its own [B, S, V], or a view of a buffer it shares (prefill runs)
        self.logits = cupy.empty((B, S, session.vocab_size), session.logits_dtype) if logits is None else logits
        n, H, D = len(session.cache_names), session.n_kv_heads, session.head_dim
        past = plan.cache.reshape(n, B, H, C, D)
        # The present outputs packed back to back: [n * B * H, C + S, D] rows for the commit copy; or
        # the cache itself (a shared buffer).
        self.present = past if session.shared_buffer else scratch[:n * B * H * (C + S) * D].reshape(n, B, H, C + S, D)
        self.options = run_options("cuda", graph_id)
        self.binding = session.session.io_binding()
        views = {"input_ids": self.ids, "attention_mask": self.feed[2 * B * S:].reshape(B, C + S)}
        if session.has_position_ids:
            views["position_ids"] = self.feed[B * S:2 * B * S].reshape(B, S)
        for name, array in views.items():
            self._bind(self.binding.bind_input, session, name, array)
        if session.shared_buffer:
            # The capacity, within the rotary tables' rows (the model's context)
            total = min(C, session.spec.context_length or C)
            self.binding.bind_cpu_input("total_sequence_length", np.array([total], np.int32))
        for t, (past_name, present_name) in enumerate(session.cache_names):
            self._bind(self.binding.bind_input, session, past_name, past[t])
            self._bind(self.binding.bind_output, session, present_name, self.present[t])
        self._bind(self.binding.bind_output, session, "logits", self.logits)

    @staticmethod
    def _bind(bind, session, name, array):
        bind(name, "cuda", session.device_id, array.dtype.type, array.shape, array.data.ptr)


class _Plan:
    """Everything fixed for one (batch, capacity): the cache buffer, the present scratch, the feed ring
    and the per-S bindings."""

    def __init__(self, session: "StaticDecoderSession", batch: int, capacity: int):
        import cupy
        self.batch, self.capacity = batch, capacity
        n, H, D = len(session.cache_names), session.n_kv_heads, session.head_dim
        with session.on_stream():
            self.cache = cupy.zeros((n, batch * H * capacity * D), session.kv_dtype)
            scratch = 0 if session.shared_buffer else n * batch * H * (capacity + MAX_GRAPH_STEPS) * D
            self.scratch = cupy.empty(scratch, session.kv_dtype)
        self.ring = PinnedRing(RING_SLOTS)   # the runs' feeds, copied from page-locked memory
        self.steps: dict[int, _Step] = {}            # the loop's runs, each with its own logits
        self.prefill_steps: dict[int, _Step] = {}    # prefill runs, all writing prefill_logits
        self.prefill_logits = None                   # [B * MAX_GRAPH_STEPS * V], at the first prefill run

    def prefill_logits_view(self, session: "StaticDecoderSession", steps: int):
        """[B, steps, V] at the start of the plan's one prefill logits buffer (made at first use)."""
        import cupy
        B, V = self.batch, session.vocab_size
        if self.prefill_logits is None:
            with session.on_stream():
                self.prefill_logits = cupy.empty(B * MAX_GRAPH_STEPS * V, session.logits_dtype)
        return self.prefill_logits[:B * steps * V].reshape(B, steps, V)


class StaticDecoderSession(DecoderSession):
    """DecoderSession on CUDA with fixed bindings and, with capture=True, CUDA-graph replay (see the
    module docstring).

    Raises ValueError for models it cannot run this way (no position_ids input, a use_cache_branch
    input) and, with capture=True, onnxruntime's error when the graph cannot be captured (nodes on
    the CPU).
    """

    feeds_shared_buffer = True

    def _model_path(self, spec):
        from specsample_cupy.runtime.builder_graph import for_fixed_bindings
        return for_fixed_bindings(spec.onnx_path)

    def __init__(self, spec: ModelSpec, device: str, stream, device_id: int = 0, *, capture: bool = True):
        if device != "cuda":
            raise ValueError("StaticDecoderSession runs on device='cuda' only")
        super().__init__(spec, device, stream, device_id, cuda_graph=capture)
        if not (self.has_position_ids or self.shared_buffer) or self.has_cache_branch:
            raise ValueError(f"{spec.onnx_path}: static cache runs need position_ids and no use_cache_branch")
        self.capture = capture
        self._plans: dict[tuple[int, int], _Plan] = {}
        self._graph_ids = itertools.count(1)   # unique per binding: a graph replays its capture's addresses
        self._plan = None
        self.graph_steps = 0                   # runs replayed or captured as CUDA graphs

    def new_cache(self, batch: int, capacity: int, slack: int = 32) -> StaticKVCache:
        if self.shared_buffer and batch > 1:
            raise ValueError(f"{self.spec.onnx_path}: the GroupQueryAttention layout (convert --attention gqa) "
                             f"decodes one prompt at a time (ONNX Runtime runs several new tokens over a past at "
                             f"batch 1 only), got {batch}; pass one prompt per call, or convert with --attention onnx")
        capacity = -(-int(capacity) // CAPACITY_ROUND) * CAPACITY_ROUND
        key = (batch, capacity)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= MAX_PLANS:
                self._plans.pop(next(iter(self._plans)))
            plan = self._plans[key] = _Plan(self, batch, capacity)
        self._plan = plan
        return StaticKVCache(self, plan)

    def _step(self, steps: int, prefill: bool = False) -> _Step:
        plan = self._plan
        kept = plan.prefill_steps if prefill else plan.steps
        step = kept.get(steps)
        if step is None:
            if steps <= MAX_GRAPH_STEPS:   # kept, with its binding; a graph when capturing
                graph_id = next(self._graph_ids) if self.capture else -1
                logits = plan.prefill_logits_view(self, steps) if prefill else None
                step = kept[steps] = _Step(self, plan, steps, graph_id, plan.scratch, logits)
            else:   # a prefill chunk: its own scratch, not captured, not kept
                import cupy
                n, H, D = len(self.cache_names), self.n_kv_heads, self.head_dim
                scratch = cupy.empty(n * plan.batch * H * (plan.capacity + steps) * D, self.kv_dtype)
                step = _Step(self, plan, steps, -1, scratch)
        return step

    def forward(self, cache: StaticKVCache, input_ids: np.ndarray, new_mask: np.ndarray, positions: np.ndarray,
                device_ids=None, device_mask=None, prefill: bool = False):
        """As DecoderSession.forward (same arguments and result). device_mask: None, or the cache's slot
        mask [B, C] on the device (the device loop's, which the host's cache.mask does not follow):
        the run's attention mask is read from it and its new columns are recorded in it; the caller
        makes room first (cache.make_room() would read the host's mask). prefill: the run's logits go
        to the plan's shared prefill buffer (the next prefill run overwrites them)."""
        import cupy
        batch, S = new_mask.shape
        if device_mask is None:
            cache.make_room(S)
        C, length = cache.capacity, cache.length
        step = self._step(S, prefill)
        plan, stream = self._plan, self.stream
        n_feed = step.feed.size
        limit = (self.spec.context_length or np.iinfo(np.int64).max) - 1
        with self.on_stream():
            slot, raw = plan.ring.take(n_feed * 8)
            host = raw[:n_feed * 8].view(np.int64)
            host[:batch * S] = np.asarray(input_ids).ravel()
            host[batch * S:2 * batch * S] = np.clip(positions, 0, limit).ravel()
            mask = host[2 * batch * S:].reshape(batch, C + S)
            mask[:, :length] = cache.mask if device_mask is None else 0
            mask[:, length:C] = 0
            mask[:, C:] = new_mask
            plan.ring.send(slot, step.feed.data.ptr, host.nbytes, stream)
            feed_mask = step.feed[2 * batch * S:].reshape(batch, C + S)
            if device_mask is not None:
                _copy_columns(feed_mask, 0, device_mask, 0, C, stream)
            if device_ids is not None and device_ids.shape[1]:
                dst = step.ids[:, S - device_ids.shape[1]:]
                if device_ids.dtype == np.int32 and device_ids.strides[1] == 4:
                    _widen_ids(self.device_id)(device_ids, dst, self.vocab_size, stream)
                else:
                    dst[...] = device_ids
            self.replay(step)
            # The new columns' keys/values: rows of S*D elements, from pitch (C+S)*D to pitch C*D (a
            # shared buffer has them at each row's count already).
            item = np.dtype(self.kv_dtype).itemsize
            D = self.head_dim
            if not self.shared_buffer:
                cupy.cuda.runtime.memcpy2DAsync(
                    plan.cache.data.ptr + length * D * item, C * D * item,
                    step.present.data.ptr + C * D * item, (C + S) * D * item,
                    S * D * item, step.present.shape[0] * batch * self.n_kv_heads, _D2D, stream.ptr)
            if device_mask is not None:
                _copy_columns(device_mask, length, feed_mask, C, S, stream)
        if device_mask is None:
            cache.advance(new_mask)
        else:
            cache.length += S
        return step.logits

    def replay(self, step: _Step):
        """Run a step whose feeds are already on the device (device_loop writes them); the caller
        commits its present columns and keeps the cache's column count."""
        self._run(step.binding, step.options)
        self.graph_steps += step.graph_id >= 0
        self._keep_alive = (step,)

    def last_binding(self):
        step = self._keep_alive[0]
        return step.binding, step.logits
