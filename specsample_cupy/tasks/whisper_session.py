"""ONNX Runtime sessions for a Whisper export: encoder once, merged decoder with a rolling self-KV cache.

Per utterance the encoder runs once; the first decoder pass (optimum's
no-cache branch, ``use_cache_branch=False``) reads the prompt and returns the
cross-attention K/V, which are then kept unchanged; later passes use the cache
branch, append to the self-attention K/V, and ``truncate`` rolls only those
back after a verification step rejects draft tokens.

The merged decoder has no attention mask input, so rows of a batch cannot
have different lengths: the ASR evaluation decodes one utterance at a time.

On ``device="cuda"`` all tensors stay on the GPU as CuPy arrays bound with
ONNX Runtime's IO binding; on ``device="cpu"`` they are NumPy arrays.
"""
from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path

import numpy as np

from specsample_cupy.runtime.model_folder import ModelSpec

from specsample_cupy.runtime.ort_session import array_module

from specsample_cupy.runtime.sessions import overlay_ids
from specsample_cupy.tasks.datasets import DataError
from specsample_cupy.tasks.whisper_config import WhisperSpec, load_whisper_spec

_PAST = re.compile(r"past_key_values\.(\d+)\.(decoder|encoder)\.(key|value)$")
_ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
               "tensor(int64)": np.int64, "tensor(bool)": np.bool_}


class OrtRunner:
    """One InferenceSession; feeds/returns NumPy on the CPU, CuPy (IO binding) on the GPU.

    Sessions are created by runtime/ort_session.py's helper, so on the GPU they run on
    the decoder's CUDA stream, like the decoder-only sessions.
    """

    def __init__(self, path: Path, device: str, stream=None, device_id: int = 0):
        from specsample_cupy.runtime.ort_session import _inference_session

        if not path.is_file():
            raise DataError(f"missing ONNX file {path}")
        self.session = _inference_session(path, device, stream, device_id)
        self.device, self.device_id = device, device_id
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.xp = array_module(device)
        self.run_host_s = 0.0   # host time inside ONNX Runtime's run calls, summed

    def input_dtype(self, name: str):
        return _ORT_DTYPES.get(self.inputs[name].type, np.float32)

    def run(self, feeds: dict, skip_outputs=()) -> dict:
        """Run with ``feeds`` (arrays of self.xp); returns name -> array (skipped ones absent)."""
        wanted = [n for n in self.output_names if n not in skip_outputs]
        started = time.perf_counter()
        try:
            if self.device != "cuda":
                return dict(zip(wanted, self.session.run(wanted, feeds)))
            return self._run_cuda(feeds, wanted)
        finally:
            self.run_host_s += time.perf_counter() - started

    def _run_cuda(self, feeds: dict, wanted: list[str]) -> dict:
        import cupy

        io = self.session.io_binding()
        keep = []
        for name, arr in feeds.items():
            if isinstance(arr, np.ndarray):            # tiny host inputs, e.g. the If condition
                io.bind_cpu_input(name, arr)
                continue
            arr = cupy.ascontiguousarray(arr)
            keep.append(arr)
            io.bind_input(name, "cuda", self.device_id, arr.dtype.type, tuple(arr.shape), arr.data.ptr)
        for name in wanted:
            io.bind_output(name, "cuda", self.device_id)
        # Inputs may come from CuPy work still queued; this run is synchronous (ORT's default),
        # so its outputs are complete when it returns.
        cupy.cuda.get_current_stream().synchronize()
        self.session.run_with_iobinding(io)
        out = {}
        for name, value in zip(wanted, io.get_outputs()):
            out[name] = _ortvalue_to_cupy(value)
        return out


def _ortvalue_to_cupy(value):
    """Zero-copy CuPy view of a device OrtValue (the OrtValue is kept alive as the owner)."""
    import cupy

    shape = tuple(value.shape())
    dtype = np.dtype(_ORT_DTYPES[value.data_type()])
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes == 0:
        return cupy.empty(shape, dtype)
    mem = cupy.cuda.UnownedMemory(value.data_ptr(), nbytes, value)
    return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(mem, 0))


class WhisperModel:
    """A Whisper export folder: encoder + merged decoder + what its JSON files say."""

    def __init__(self, model_dir, *, device: str = "cpu", language: str | None = "en",
                 task: str = "transcribe", stream=None, device_id: int = 0):
        from tokenizers import Tokenizer

        self.dir = Path(model_dir)
        if not self.dir.is_dir():
            raise DataError(f"model folder {self.dir} does not exist")
        if not (self.dir / "encoder_model.onnx").is_file():
            raise DataError(f"{self.dir} is not a Whisper export: no encoder_model.onnx (export with "
                            "optimum-cli --task automatic-speech-recognition-with-past)")
        tok_path = self.dir / "tokenizer.json"
        if not tok_path.is_file():
            raise DataError(f"{self.dir} has no tokenizer.json")
        self.tokenizer = Tokenizer.from_file(str(tok_path))
        self.spec: WhisperSpec = load_whisper_spec(self.dir, language=language, task=task,
                                                   tokenizer=self.tokenizer)
        self.encoder = OrtRunner(self.dir / "encoder_model.onnx", device, stream, device_id)
        merged = self.dir / "decoder_model_merged.onnx"
        if not merged.is_file():
            raise DataError(f"{self.dir} has no decoder_model_merged.onnx: export with "
                            "'--task automatic-speech-recognition-with-past' (merged decoder)")
        self.decoder = OrtRunner(merged, device, stream, device_id)
        if "use_cache_branch" not in self.decoder.inputs:
            raise DataError(f"{merged} has no use_cache_branch input (not a merged decoder)")
        self.device, self.xp = device, self.decoder.xp
        layers = {}
        for name, info in self.decoder.inputs.items():
            m = _PAST.match(name)
            if m:
                layers.setdefault(int(m.group(1)), {})[(m.group(2), m.group(3))] = info
        self.n_layers = len(layers)
        heads, head_dim = layers[0][("decoder", "key")].shape[1], layers[0][("decoder", "key")].shape[3]
        if not (isinstance(heads, int) and isinstance(head_dim, int)):
            # Symbolic dims in the graph: fall back to the model's config.
            cfg = json.loads((self.dir / "config.json").read_text()) if (self.dir / "config.json").is_file() else {}
            heads = cfg.get("decoder_attention_heads")
            head_dim = cfg["d_model"] // heads if heads and cfg.get("d_model") else None
            if not heads or not head_dim:
                raise DataError(f"{merged}: cannot tell the decoder's head count/size from the graph or config")
        self.n_heads, self.head_dim = heads, head_dim
        self.kv_dtype = self.decoder.input_dtype("past_key_values.0.decoder.key")
        self.feature_dtype = self.encoder.input_dtype("input_features")
        vocab = self.spec.vocab_size or self.tokenizer.get_vocab_size(with_added_tokens=True)
        # The decoder-only loop's view of the model: special ids, tokenizer, context.
        self.model_spec = ModelSpec(self.dir, merged, {"vocab_size": vocab}, int(vocab),
                                    self.spec.max_target_positions, (self.spec.eos_token_id,),
                                    None, self.spec.eos_token_id, self.tokenizer)

    def encode(self, features):
        """features [B, n_mels, 3000] (numpy or cupy) -> encoder hidden states on the device."""
        xp = self.xp
        feats = xp.asarray(features, dtype=self.feature_dtype)
        return self.encoder.run({"input_features": feats})["last_hidden_state"]

    def decode_text(self, token_ids) -> str:
        return self.tokenizer.decode([int(t) for t in token_ids], skip_special_tokens=True).strip()


class WhisperCache:
    """Self-attention K/V of one batch plus its fixed cross-attention K/V and encoder output.

    Offers what decoder.SpeculativeDecoder's loop uses of sessions_cache.KVCache
    (``n_real``, ``rollback``, ``compactions``). Rollback really truncates: with
    no attention mask in the graph, a rejected token cannot be hidden as a hole,
    so every row must keep the same number of tokens (one utterance per batch).
    """

    compactions = 0

    def __init__(self, encoder_hidden, batch: int):
        self.encoder_hidden, self.batch = encoder_hidden, batch
        self.self_kv: list | None = None      # [k0, v0, k1, v1, ...], each [B, H, length, hd]
        self.cross_kv: list | None = None
        self.length = 0

    @property
    def n_real(self) -> np.ndarray:
        return np.full(self.batch, self.length, np.int64)

    def rollback(self, keep) -> None:
        keep = np.minimum(self.n_real, np.asarray(keep))
        if (keep != keep[0]).any():
            raise ValueError("Whisper decoder rows must stay equally long (decode one utterance per batch)")
        self.truncate(int(keep[0]))

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` self-attention positions; cross K/V are untouched."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} positions to {length}")
        if length < self.length:
            self.self_kv = [kv[:, :, :length] for kv in self.self_kv]
            self.length = length


class WhisperDecoderSession:
    """The merged decoder behind the interface of sessions.DecoderSession, for decode/decoder.py's loop.

    ``set_encoder_output`` gives it the current utterance; ``new_cache`` then
    starts an empty decoder state for it; ``forward(cache, ids, mask, positions)``
    appends ``ids`` and returns float32 logits [B, S, V] with Whisper's
    suppressed tokens at -inf (suppress_tokens everywhere, begin_suppress_tokens
    at the first generated position), as transformers' generate() does.
    """

    def __init__(self, model: WhisperModel):
        self.model, self.xp, self.device = model, model.xp, model.device
        self.spec = model.model_spec
        self.vocab_size = model.model_spec.vocab_size
        self.logits_dtype = np.dtype(np.float32)
        self._encoder_hidden = None
        spec = model.spec
        self._prompt_len = len(spec.prompt_ids)
        # Index arrays live with the logits (NumPy or CuPy).
        self._suppress = self.xp.asarray([t for t in spec.suppress_tokens if t < self.vocab_size], np.int64)
        self._begin = self.xp.asarray([t for t in spec.begin_suppress_tokens if t < self.vocab_size], np.int64)
        self._cache_position = "cache_position" in model.decoder.inputs
        self.run_span = None   # set by the decoder's loop: a context manager around each run (timing)

    @property
    def run_host_s(self) -> float:
        return self.model.decoder.run_host_s

    def set_encoder_output(self, hidden) -> None:
        self._encoder_hidden = hidden

    def new_cache(self, batch: int, capacity: int = 0, slack: int = 0) -> WhisperCache:
        if self._encoder_hidden is None:
            raise RuntimeError("set_encoder_output() must be called before decoding")
        if int(self._encoder_hidden.shape[0]) != batch:
            raise ValueError(f"encoder output has batch {self._encoder_hidden.shape[0]}, decoding {batch}")
        return WhisperCache(self._encoder_hidden, batch)

    def _dummy_past(self, batch):
        # optimum feeds length-1 zeros to the no-cache branch, which ignores them.
        m = self.model
        zeros = self.xp.zeros((batch, m.n_heads, 1, m.head_dim), m.kv_dtype)
        return [zeros] * 4

    def forward(self, cache: WhisperCache, input_ids, new_mask, positions, device_ids=None, prefill=False):
        xp, m = self.xp, self.model
        new_mask = np.asarray(new_mask, bool)
        if not new_mask.all():
            raise ValueError("Whisper's merged decoder has no attention mask, so every fed column must be "
                             "a real token of every row (decode one utterance per batch)")
        ids = overlay_ids(xp.array(input_ids, dtype=xp.int64), device_ids)
        steps = ids.shape[1]
        if cache.length + steps > m.spec.max_target_positions:
            raise ValueError(f"decoder length {cache.length + steps} exceeds the model's "
                             f"max_target_positions {m.spec.max_target_positions}")
        first = cache.self_kv is None
        feeds = {"input_ids": ids, "encoder_hidden_states": cache.encoder_hidden,
                 "use_cache_branch": np.array([not first])}
        dummy = self._dummy_past(cache.batch) if first else None
        for i in range(m.n_layers):
            for j, (part, kind) in enumerate((("decoder", "key"), ("decoder", "value"),
                                              ("encoder", "key"), ("encoder", "value"))):
                if first:
                    value = dummy[j]
                elif part == "decoder":
                    value = cache.self_kv[2 * i + j % 2]
                else:
                    value = cache.cross_kv[2 * i + j % 2]
                feeds[f"past_key_values.{i}.{part}.{kind}"] = value
        if self._cache_position:
            feeds["cache_position"] = xp.arange(cache.length, cache.length + steps, dtype=xp.int64)
        # In the cache branch the encoder presents are empty placeholders: not worth binding.
        skip = () if first else tuple(f"present.{i}.encoder.{k}" for i in range(m.n_layers)
                                      for k in ("key", "value"))
        with self.run_span() if self.run_span else contextlib.nullcontext():
            out = m.decoder.run(feeds, skip_outputs=skip)
        cache.self_kv = [out[f"present.{i}.decoder.{k}"] for i in range(m.n_layers) for k in ("key", "value")]
        if first:
            cache.cross_kv = [out[f"present.{i}.encoder.{k}"] for i in range(m.n_layers)
                              for k in ("key", "value")]
        start = cache.length
        cache.length += steps
        logits = out["logits"].astype(xp.float32, copy=False)
        return self._suppress_logits(logits, start)

    def _suppress_logits(self, logits, start: int):
        if self._suppress.size:
            logits[..., self._suppress] = -np.inf
        # Row j predicts position start + j + 1; the first generated token sits at prompt_len.
        row = self._prompt_len - 1 - start
        if self._begin.size and 0 <= row < logits.shape[1]:
            logits[:, row, self._begin] = -np.inf
        return logits
