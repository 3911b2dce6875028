"""ONNX decoders exported by Hugging Face optimum, run one step at a time over a KV cache.

Two export layouts are understood:

    model.onnx                  decoder with past. Inputs input_ids [B,S] int64, attention_mask [B,past+S]
                                int64, position_ids [B,S] int64 (optional), past_key_values.{i}.key/.value
                                [B,H,past,D]; outputs logits [B,S,V] and present.{i}.key/.value [B,H,past+S,D].
    decoder_model_merged.onnx   the same plus a bool input use_cache_branch; the first pass takes the
                                no-past branch (use_cache_branch False, empty past), as optimum does.

ONNX Runtime reads and writes every tensor in place through IOBinding: the cache (sessions_cache.KVCache)
and the logits live in preallocated arrays of the session's array module, CuPy on device="cuda" (logits
never leave the GPU) and NumPy on device="cpu". Both models of a pair share one CUDA stream, which ONNX
Runtime uses as its compute stream, so a run is ordered with the CuPy work around it without host syncs.
"""
from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path

import numpy as np

from specsample_cupy.runtime.genai_config import check_graph_agrees
from specsample_cupy.runtime.model_folder import ModelSpec
from specsample_cupy.runtime.ort_session import _inference_session, array_module, run_options
from specsample_cupy.runtime.sessions_cache import KVCache, buffer_ptr

PAST_INPUT = re.compile(r"past_key_values\.(\d+)\.(key|value)$")
KNOWN_INPUTS = {"input_ids", "attention_mask", "position_ids", "use_cache_branch", "total_sequence_length"}
ONNX_FLOAT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def overlay_ids(ids, device_ids=None):
    """Replace the last k columns of the [B, S] ids (in place) by device_ids [B, k] when given: draft
    tokens that never leave the device. Returns ids."""
    if device_ids is not None and device_ids.shape[1]:
        ids[:, ids.shape[1] - device_ids.shape[1]:] = device_ids
    return ids


class DecoderSession:
    """One decoder-with-past ONNX model bound to preallocated buffers.

    Graph facts read from the model: n_layer, n_kv_heads, head_dim, kv_dtype, logits_dtype,
    has_position_ids, has_cache_branch. Use new_cache() once per batch, then forward() per step.
    """

    feeds_shared_buffer = False   # sessions_static.StaticDecoderSession binds one buffer as past and present

    def __init__(self, spec: ModelSpec, device: str = "cpu", stream=None, device_id: int = 0, *,
                 cuda_graph: bool = False, cpu_threads: int | None = None):
        self.spec, self.device, self.stream, self.device_id = spec, device, stream, device_id
        self.xp = array_module(device)
        path, weights_dir = self._model_path(spec)
        self.session = _inference_session(path, device, stream, device_id, cuda_graph, cpu_threads, weights_dir)
        self._read_graph()
        if self.shared_buffer and not self.feeds_shared_buffer:
            raise ValueError(f"{spec.onnx_path}: the GroupQueryAttention layout (convert --attention gqa) runs on "
                             "CUDA with fixed bindings only; convert with --attention onnx for this device")
        self._binding = self.session.io_binding()
        self._run_options = run_options(device)
        self._logits_buffer = None
        self._keep_alive = ()
        self.run_host_s = 0.0   # host time inside ONNX Runtime's run calls, summed
        self.run_span = None    # optional: () -> context manager wrapped around each run call (timing)

    def _model_path(self, spec: ModelSpec) -> tuple[Path, Path | None]:
        """The ONNX file the session loads and the folder of its external data when that is elsewhere
        (sessions_static: a builder graph rewritten for its bindings)."""
        return spec.onnx_path, None

    def _read_graph(self):
        path = self.spec.onnx_path
        inputs = {i.name: i for i in self.session.get_inputs()}
        outputs = {o.name: o for o in self.session.get_outputs()}
        layers = sorted({int(m.group(1)) for m in map(PAST_INPUT.match, inputs) if m})
        if not layers:
            raise ValueError(f"{path} is not a decoder-with-past export: it has no past_key_values.* inputs "
                             "(export with the task text-generation-with-past)")
        for name in ("input_ids", "attention_mask"):
            if name not in inputs:
                raise ValueError(f"{path} lacks the input {name!r}")
        if "logits" not in outputs:
            raise ValueError(f"{path} lacks the output 'logits'")
        if layers != list(range(len(layers))):
            raise ValueError(f"{path}: past_key_values layers {layers} are not numbered 0..n-1")
        self.n_layer = len(layers)
        self.cache_names = []   # (past input, present output) per cache tensor: key, value of layer 0, ...
        for i in range(self.n_layer):
            for kind in ("key", "value"):
                past, present = f"past_key_values.{i}.{kind}", f"present.{i}.{kind}"
                if past not in inputs:
                    raise ValueError(f"{path} lacks the input {past!r}")
                if present not in outputs:
                    raise ValueError(f"{path} lacks the output {present!r}")
                self.cache_names.append((past, present))
        unknown = sorted(n for n in inputs if n not in KNOWN_INPUTS and not PAST_INPUT.match(n))
        if unknown:
            raise ValueError(f"{path} has inputs this decoder cannot feed: {unknown}")

        key = inputs["past_key_values.0.key"]
        if len(key.shape) != 4:
            raise ValueError(f"{path}: past_key_values.0.key has shape {key.shape}; expected [B, H, past, D]")
        cfg = self.spec.config
        heads = cfg.get("num_key_value_heads") or cfg.get("n_head") or cfg.get("num_attention_heads")
        hidden = cfg.get("n_embd") or cfg.get("hidden_size")
        self.n_kv_heads = key.shape[1] if isinstance(key.shape[1], int) else heads
        self.head_dim = key.shape[3] if isinstance(key.shape[3], int) else cfg.get("head_dim") or (
            hidden // (cfg.get("n_head") or cfg.get("num_attention_heads")) if hidden else None)
        if not self.n_kv_heads or not self.head_dim:
            raise ValueError(f"{path}: cannot tell the number of KV heads / head size from the graph or config")
        if self.spec.config_path is not None:
            check_graph_agrees(cfg, self.spec.config_path, self.n_layer, key.shape[1], key.shape[3], path)
        self.kv_dtype = self._float_type(key)
        self.logits_dtype = self._float_type(outputs["logits"])
        vocab = outputs["logits"].shape[-1]
        self.vocab_size = vocab if isinstance(vocab, int) else self.spec.vocab_size
        if self.vocab_size != self.spec.vocab_size:
            raise ValueError(f"{path}: logits have {self.vocab_size} columns but config.json says "
                             f"vocab_size={self.spec.vocab_size}")
        self.has_position_ids = "position_ids" in inputs
        self.has_cache_branch = "use_cache_branch" in inputs
        # convert(attention="gqa"): GroupQueryAttention writes each run's columns into the past's own
        # buffer at each row's token count (the attention mask's row sums); only fixed bindings
        # (sessions_static) can feed it, at batch 1 when a run has several new tokens.
        self.shared_buffer = "total_sequence_length" in inputs

    def _float_type(self, arg):
        if arg.type not in ONNX_FLOAT_TYPES:
            raise ValueError(f"{self.spec.onnx_path}: {arg.name} is {arg.type}; only float32 and float16 are supported")
        return np.dtype(ONNX_FLOAT_TYPES[arg.type])

    def on_stream(self):
        return self.stream if self.stream is not None else contextlib.nullcontext()

    def new_cache(self, batch: int, capacity: int, slack: int = 32) -> KVCache:
        """An empty cache for `batch` rows holding up to `capacity` columns (see KVCache)."""
        return KVCache(self.xp, len(self.cache_names), batch, self.n_kv_heads, self.head_dim, self.kv_dtype,
                       capacity, slack=slack, stream=self.stream)

    def _logits_view(self, batch: int, steps: int):
        size = batch * steps * self.vocab_size
        if self._logits_buffer is None or self._logits_buffer.size < size:
            self._logits_buffer = self.xp.empty(size, self.logits_dtype)
        return self._logits_buffer[:size].reshape(batch, steps, self.vocab_size)

    def _run(self, binding, options):
        started = time.perf_counter()
        with self.run_span() if self.run_span else contextlib.nullcontext():
            self.session.run_with_iobinding(binding, options)
        self.run_host_s += time.perf_counter() - started

    def last_binding(self):
        """(IOBinding, logits array) of the latest run: what ONNX Runtime was told to write."""
        return self._binding, self._logits_buffer

    def _bind_input(self, name, array):
        self._binding.bind_input(name, self.device, self.device_id, array.dtype.type, array.shape, buffer_ptr(array))

    def _bind_output(self, name, array):
        self._binding.bind_output(name, self.device, self.device_id, array.dtype.type, array.shape, buffer_ptr(array))

    def forward(self, cache: KVCache, input_ids: np.ndarray, new_mask: np.ndarray, positions: np.ndarray,
                device_ids=None, prefill: bool = False):
        """Run S new columns through the model and append their keys/values to the cache.

        input_ids: [B, S] host ints; device_ids: optional [B, k] ints of the session's array module
            that replace the last k columns of input_ids (draft tokens stay on the device).
        new_mask: [B, S] host bool/int, 1 where the column is a real token of that row, 0 for a hole
            (padding, a finished request, a position past a request's draft length).
        positions: [B, S] host ints, each real token's index in its sequence (holes: anything in range).
        prefill: a prefill run, whose logits the caller does not read (sessions with fixed bindings
            then write them to a buffer that every prefill run shares; here the same buffer as any run).
        Returns logits [B, S, V] of the session's array module, a view of a buffer the next forward()
        overwrites.
        """
        xp = self.xp
        batch, steps = new_mask.shape
        cache.make_room(steps)
        attention_mask = np.concatenate([cache.mask, new_mask.astype(np.int64)], axis=1)
        # The host-side int64 feeds travel in one host-to-device copy, then split into views.
        host = {"attention_mask": attention_mask, "input_ids": np.asarray(input_ids, np.int64)}
        if self.has_position_ids:
            limit = (self.spec.context_length or np.iinfo(np.int64).max) - 1
            host["position_ids"] = np.clip(positions, 0, limit).astype(np.int64)
        with self.on_stream():
            packed = xp.asarray(np.concatenate([a.ravel() for a in host.values()]))
            feeds, start = {}, 0
            for name, a in host.items():
                feeds[name] = packed[start:start + a.size].reshape(a.shape)
                start += a.size
            overlay_ids(feeds["input_ids"], device_ids)
            for name, array in feeds.items():
                self._bind_input(name, array)
            if self.has_cache_branch:
                use_cache = np.array([cache.length > 0])
                self._binding.bind_cpu_input("use_cache_branch", use_cache)
                feeds["use_cache_branch"] = use_cache
            past, present = cache.past(), cache.present(steps)
            for (past_name, present_name), past_tensor, present_tensor in zip(self.cache_names, past, present):
                self._bind_input(past_name, past_tensor)
                self._bind_output(present_name, present_tensor)
            logits = self._logits_view(batch, steps)
            self._bind_output("logits", logits)
            self._run(self._binding, self._run_options)
            # The run may still be reading these on the stream; later allocations are ordered after it,
            # but keep them referenced until the next call all the same.
            self._keep_alive = tuple(feeds.values())
        cache.advance(new_mask)
        return logits
