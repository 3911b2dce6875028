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

import re
from pathlib import Path

import numpy as np

from specsample_cupy.tasks.datasets import DataError
from specsample_cupy.tasks.whisper_config import WhisperSpec, load_whisper_spec

_PAST = re.compile(r"past_key_values\.(\d+)\.(decoder|encoder)\.(key|value)$")
_ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
               "tensor(int64)": np.int64, "tensor(bool)": np.bool_}


def _providers(device: str):
    if device == "cuda":
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


class OrtRunner:
    """One InferenceSession; feeds/returns NumPy on the CPU, CuPy (IO binding) on the GPU."""

    def __init__(self, path: Path, device: str, threads: int = 0):
        import onnxruntime as ort

        if not path.is_file():
            raise DataError(f"missing ONNX file {path}")
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), sess_options=opts,
                                            providers=_providers(device))
        if device == "cuda" and "CUDAExecutionProvider" not in self.session.get_providers():
            raise RuntimeError(f"{path}: ONNX Runtime has no CUDAExecutionProvider here "
                               "(install onnxruntime-gpu, or use --device cpu)")
        self.device = device
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]
        if device == "cuda":
            import cupy

            self.xp = cupy
        else:
            self.xp = np

    def input_dtype(self, name: str):
        return _ORT_DTYPES.get(self.inputs[name].type, np.float32)

    def run(self, feeds: dict, skip_outputs=()) -> dict:
        """Run with ``feeds`` (arrays of self.xp); returns name -> array (skipped ones absent)."""
        wanted = [n for n in self.output_names if n not in skip_outputs]
        if self.device != "cuda":
            return dict(zip(wanted, self.session.run(wanted, feeds)))
        return self._run_cuda(feeds, wanted)

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
            io.bind_input(name, "cuda", cupy.cuda.runtime.getDevice(), arr.dtype,
                          tuple(arr.shape), arr.data.ptr)
        for name in wanted:
            io.bind_output(name, "cuda", cupy.cuda.runtime.getDevice())
        # CuPy kernels that produced the inputs run on CuPy's stream; ORT uses its own.
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
                 task: str = "transcribe", threads: int = 0):
        from tokenizers import Tokenizer

        self.dir = Path(model_dir)
        if not self.dir.is_dir():
            raise DataError(f"model folder {self.dir} does not exist")
        tok_path = self.dir / "tokenizer.json"
        if not tok_path.is_file():
            raise DataError(f"{self.dir} has no tokenizer.json")
        self.tokenizer = Tokenizer.from_file(str(tok_path))
        self.spec: WhisperSpec = load_whisper_spec(self.dir, language=language, task=task,
                                                   tokenizer=self.tokenizer)
        self.encoder = OrtRunner(self.dir / "encoder_model.onnx", device, threads)
        merged = self.dir / "decoder_model_merged.onnx"
        if not merged.is_file():
            raise DataError(f"{self.dir} has no decoder_model_merged.onnx: export with "
                            "'--task automatic-speech-recognition-with-past' (merged decoder)")
        self.decoder = OrtRunner(merged, device, threads)
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
            raise DataError(f"{merged}: past key/value inputs need static head dims")
        self.n_heads, self.head_dim = heads, head_dim
        self.kv_dtype = self.decoder.input_dtype("past_key_values.0.decoder.key")
        self.feature_dtype = self.encoder.input_dtype("input_features")

    def encode(self, features):
        """features [B, n_mels, 3000] (numpy or cupy) -> encoder hidden states on the device."""
        xp = self.xp
        feats = xp.asarray(features, dtype=self.feature_dtype)
        return self.encoder.run({"input_features": feats})["last_hidden_state"]

    def decode_text(self, token_ids) -> str:
        return self.tokenizer.decode([int(t) for t in token_ids], skip_special_tokens=True).strip()


class WhisperDecoderSession:
    """Decoder state for one batch of utterances: cross K/V fixed, self K/V rolling.

    ``forward(ids)`` appends ``ids`` [B, S] and returns logits [B, S, V] float32
    (suppressed tokens set to -inf, as transformers' Whisper generate does);
    ``truncate(n)`` keeps the first ``n`` positions of the self-attention cache.
    """

    def __init__(self, model: WhisperModel, encoder_hidden):
        self.model, self.xp = model, model.xp
        self.encoder_hidden = encoder_hidden
        self.batch = int(encoder_hidden.shape[0])
        self.self_kv: list | None = None     # [k0, v0, k1, v1, ...] [B, H, length, hd]
        self.cross_kv: list | None = None
        self.length = 0
        spec = model.spec
        self._prompt_len = len(spec.prompt_ids)
        self._suppress = np.asarray(spec.suppress_tokens, np.int64)
        self._begin_suppress = np.asarray(spec.begin_suppress_tokens, np.int64)
        self._cache_position = "cache_position" in model.decoder.inputs

    @property
    def vocab_size(self):
        return self.model.spec.vocab_size

    def _dummy_past(self):
        # optimum feeds length-1 zeros to the no-cache branch, which ignores them.
        shape = (self.batch, self.model.n_heads, 1, self.model.head_dim)
        zeros = self.xp.zeros(shape, self.model.kv_dtype)
        return [zeros] * (4 * self.model.n_layers)

    def forward(self, ids):
        xp, m = self.xp, self.model
        ids = xp.asarray(ids, dtype=xp.int64)
        if ids.ndim == 1:
            ids = ids[:, None]
        first = self.self_kv is None
        if not first and self.length + ids.shape[1] > m.spec.max_target_positions:
            raise ValueError(f"decoder length {self.length + ids.shape[1]} exceeds "
                             f"max_target_positions {m.spec.max_target_positions}")
        feeds = {"input_ids": ids, "encoder_hidden_states": self.encoder_hidden,
                 "use_cache_branch": np.array([not first])}
        past = self._dummy_past() if first else None
        for i in range(m.n_layers):
            for j, (part, kind) in enumerate((("decoder", "key"), ("decoder", "value"),
                                              ("encoder", "key"), ("encoder", "value"))):
                name = f"past_key_values.{i}.{part}.{kind}"
                if first:
                    feeds[name] = past[4 * i + j]
                elif part == "decoder":
                    feeds[name] = self.self_kv[2 * i + (j % 2)]
                else:
                    feeds[name] = self.cross_kv[2 * i + (j % 2)]
        if self._cache_position:
            feeds["cache_position"] = xp.arange(self.length, self.length + ids.shape[1],
                                                dtype=xp.int64)
        skip = () if first else tuple(f"present.{i}.encoder.{k}" for i in range(m.n_layers)
                                      for k in ("key", "value"))
        out = m.decoder.run(feeds, skip_outputs=skip)
        self.self_kv = [out[f"present.{i}.decoder.{k}"] for i in range(m.n_layers)
                        for k in ("key", "value")]
        if first:
            self.cross_kv = [out[f"present.{i}.encoder.{k}"] for i in range(m.n_layers)
                             for k in ("key", "value")]
        start = self.length
        self.length += ids.shape[1]
        return self._suppress_logits(out["logits"].astype(xp.float32, copy=False), start)

    def _suppress_logits(self, logits, start: int):
        """-inf for suppress_tokens everywhere, begin_suppress_tokens at the first generated token."""
        V = logits.shape[-1]
        if self._suppress.size:
            logits[..., self._suppress[self._suppress < V]] = -np.inf
        # Row j predicts position start + j + 1; the first generated token sits at prompt_len.
        row = self._prompt_len - 1 - start
        if self._begin_suppress.size and 0 <= row < logits.shape[1]:
            logits[:, row, self._begin_suppress[self._begin_suppress < V]] = -np.inf
        return logits

    def truncate(self, length: int) -> None:
        """Roll the self-attention cache back to ``length`` positions (cross K/V stay)."""
        if length > self.length or length < 0:
            raise ValueError(f"cannot truncate a cache of {self.length} to {length}")
        if length == self.length:
            return
        self.self_kv = [kv[:, :, :length] for kv in self.self_kv]
        self.length = length
