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
import functools
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specsample_cupy.runtime.genai_config import check_graph_agrees, config_from_genai
from specsample_cupy.runtime.sessions_cache import KVCache, buffer_ptr

MODEL_FILES = ("model.onnx", "decoder_model_merged.onnx", "decoder_with_past_model.onnx")
PAST_INPUT = re.compile(r"past_key_values\.(\d+)\.(key|value)$")
KNOWN_INPUTS = {"input_ids", "attention_mask", "position_ids", "use_cache_branch", "total_sequence_length"}
ONNX_FLOAT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
CONTEXT_KEYS = ("n_positions", "max_position_embeddings", "n_ctx")


def _read_json(path: Path) -> dict:
    """The JSON object in `path`, or {} when there is no such file. Anything else wrong with the file
    raises ValueError in one line that names it: the CLI prints that line, never a traceback."""
    if not path.exists():
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from exc
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _ids(value, path: Path, key: str) -> tuple[int, ...]:
    """A config's token id field (None, an int or a list of ints) as a tuple; ValueError naming the file
    and key for anything else (a float or a string id would index the vocabulary wrongly later)."""
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ValueError(f"{path}: {key} must be a token id or a list of token ids, got {value!r}")
    return tuple(values)


def _positive_int(config: dict, key: str, path: Path) -> int:
    value = config[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{path}: {key} must be a positive integer, got {value!r}")
    return value


def _load_tokenizer(path: Path):
    """tokenizers.Tokenizer from tokenizer.json. The tokenizers library raises a plain Exception (exactly
    that class) for every parse or read error, so exactly that class is turned into ValueError naming the
    file; its subclasses (MemoryError, ...) are not about the file and propagate."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:   # noqa: BLE001 - narrowed to the exact class just below
        if type(exc) is not Exception:
            raise
        detail = (str(exc).splitlines() or ["unreadable"])[0]
        raise ValueError(f"{path}: not a valid tokenizers file ({detail})") from exc


@dataclass
class ModelSpec:
    """What a model directory declares: the ONNX file, config, tokenizer and special token ids."""
    model_dir: Path
    onnx_path: Path
    config: dict
    vocab_size: int
    context_length: int | None   # n_positions / max_position_embeddings; None if the config has none
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    pad_token_id: int
    tokenizer: object            # tokenizers.Tokenizer
    config_path: Path | None = None   # where config came from (config.json or genai_config.json)

    @classmethod
    def from_dir(cls, model_dir) -> "ModelSpec":
        """Read and check a model directory. Raises ValueError, one line naming the file and what is
        wrong, for a missing or unusable file (the ONNX file itself is checked when a session opens it)."""
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise ValueError(f"model directory {model_dir} does not exist")
        config_path = model_dir / "config.json"
        genai_path = model_dir / "genai_config.json"
        genai_file = None
        if not config_path.exists() and genai_path.exists():   # ONNX Runtime GenAI's builder folder
            config, genai_file = config_from_genai(_read_json(genai_path), genai_path)
            config_path = genai_path
        names = ((genai_file,) if genai_file else ()) + MODEL_FILES
        onnx_path = next((model_dir / n for n in names if (model_dir / n).exists()), None)
        if onnx_path is None:
            if (model_dir / "decoder_model.onnx").exists():
                raise ValueError(f"{model_dir} holds only decoder_model.onnx, a decoder without past; "
                                 "export with the task text-generation-with-past")
            raise ValueError(f"{model_dir} has none of {', '.join(MODEL_FILES)}")
        if not config_path.exists():
            raise ValueError(f"{model_dir} has no config.json (nor an ONNX Runtime GenAI genai_config.json)")
        if config_path.name == "config.json":
            config = _read_json(config_path)
        if "vocab_size" not in config:
            raise ValueError(f"{config_path} lacks vocab_size")
        vocab_size = _positive_int(config, "vocab_size", config_path)
        context = next((_positive_int(config, k, config_path) for k in CONTEXT_KEYS if config.get(k)), None)
        tokenizer_path = model_dir / "tokenizer.json"
        if not tokenizer_path.exists():
            raise ValueError(f"{model_dir} has no tokenizer.json")
        generation_path = model_dir / "generation_config.json"
        generation = _read_json(generation_path)
        special = {}
        for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
            source = generation_path if key in generation else config_path
            special[key] = _ids(generation.get(key, config.get(key)), source, key)
        eos, bos = special["eos_token_id"], special["bos_token_id"]
        pad = special["pad_token_id"] or eos or (0,)
        return cls(model_dir, onnx_path, config, vocab_size, context, eos, bos[0] if bos else None, pad[0],
                   _load_tokenizer(tokenizer_path), config_path)

    def encode(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text).ids
        if not ids:
            # An empty prompt still needs one token to condition on; start from BOS (or EOS, as GPT-2 does).
            start = self.bos_token_id if self.bos_token_id is not None else (self.eos_token_ids or (None,))[0]
            if start is None:
                raise ValueError("empty prompt and the model declares no bos/eos token to start from")
            ids = [start]
        return ids


def check_pair(target: ModelSpec, draft: ModelSpec):
    """Raise ValueError unless the draft can propose tokens for the target: same vocabulary and tokenizer."""
    if target.vocab_size != draft.vocab_size:
        raise ValueError(f"vocab sizes differ: target {target.model_dir} has {target.vocab_size}, "
                         f"draft {draft.model_dir} has {draft.vocab_size}")
    t_vocab = target.tokenizer.get_vocab(with_added_tokens=True)
    d_vocab = draft.tokenizer.get_vocab(with_added_tokens=True)
    if t_vocab != d_vocab:
        differing = sorted(set(t_vocab.items()) ^ set(d_vocab.items()), key=lambda kv: kv[1])[:3]
        raise ValueError(f"tokenizers differ between target {target.model_dir} and draft {draft.model_dir} "
                         f"(e.g. token/id pairs {differing} are in only one of them)")


@functools.lru_cache(maxsize=None)
def cuda_status() -> tuple[bool, str]:
    """(usable, why not): whether CuPy sees a CUDA device and ONNX Runtime has its CUDA execution provider.

    Only the expected ways of lacking a GPU answer False: a package that is not installed (ImportError) and
    a CUDA runtime error from CuPy (no device, no or too old a driver). Anything else is a broken install
    or a bug and propagates, rather than silently turning into "run on the CPU"."""
    try:
        import cupy
    except ImportError as exc:
        return False, f"CuPy is not installed ({exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        return False, f"CUDA runtime: {exc}"
    if count < 1:
        return False, "CuPy sees no CUDA device"
    try:
        import onnxruntime as ort
    except ImportError as exc:
        return False, f"onnxruntime is not installed ({exc})"
    _preload_cuda_libraries(ort)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False, "onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu, not onnxruntime)"
    return True, ""


def cuda_available() -> bool:
    """True if CuPy sees a CUDA device and ONNX Runtime has its CUDA execution provider (see cuda_status)."""
    return cuda_status()[0]


def _preload_cuda_libraries(ort):
    # onnxruntime-gpu wheels find the CUDA/cuDNN libraries of the pip packages only after this call.
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except OSError as exc:   # a library that could not be loaded: say so, the session may still work
            import warnings
            warnings.warn(f"onnxruntime.preload_dlls() could not load a CUDA library: {exc}", RuntimeWarning,
                          stacklevel=2)


def array_module(device: str):
    if device == "cuda":
        import cupy
        return cupy
    if device == "cpu":
        return np
    raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")


def onnx_load_errors() -> tuple[type, ...]:
    """The exceptions ONNX Runtime raises when creating a session from a model file it cannot load:
    InvalidProtobuf (garbage, truncated, all-zero file), InvalidArgument (an empty file: "No graph was
    found"; a graph naming a tensor nothing produces), InvalidGraph, Fail (shape inference of a corrupt
    graph), NotImplemented (an operator or opset it lacks), NoSuchFile, and UnicodeDecodeError (its error
    text quotes corrupt, non-UTF-8 names from the file)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    return (state.InvalidProtobuf, state.InvalidArgument, state.InvalidGraph, state.Fail, state.NotImplemented,
            state.NoSuchFile, UnicodeDecodeError)


def open_session_error(path, exc: BaseException) -> ValueError | None:
    """A one-line ValueError naming `path` when `exc`, raised while creating a session, says the model file
    cannot be loaded; None for other failures (an execution provider's, a refused CUDA-graph capture),
    which the caller should let propagate."""
    if isinstance(exc, UnicodeDecodeError):
        # ONNX Runtime's error text quoted corrupt bytes from the file; the text is in exc.object.
        message = bytes(exc.object).decode("utf-8", "replace") if isinstance(exc.object, bytes) else ""
    else:
        message = str(exc)
    if not isinstance(exc, onnx_load_errors()) or "Load model from" not in message:
        return None
    detail = message.split(" failed:", 1)[-1].strip().splitlines()[0][:300] if " failed:" in message else ""
    return ValueError(f"{path}: not a loadable ONNX model ({detail or type(exc).__name__})")


def _inference_session(path: Path, device: str, stream, device_id: int, cuda_graph: bool = False,
                       cpu_threads: int | None = None):
    """An ONNX Runtime session; on CUDA it computes on `stream`, and with cuda_graph=True it may capture
    runs as CUDA graphs (ONNX Runtime refuses at creation when the graph has nodes on the CPU).
    cpu_threads: on the CPU, the threads one run may use (None: ONNX Runtime's default, every core);
    processes sharing a machine (Ray workers) each get their share, or their threads contend."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if device == "cpu":
        if cpu_threads:
            options.intra_op_num_threads, options.inter_op_num_threads = int(cpu_threads), 1
        return _create_session(ort, path, options, ["CPUExecutionProvider"])
    _preload_cuda_libraries(ort)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise RuntimeError("device='cuda' needs onnxruntime-gpu (CUDAExecutionProvider is not available)")
    # Full float32 matrix products: TF32 (onnxruntime's default on Ampere and later) would move fp32
    # logits by ~1e-3 and make the same seed give other tokens than on the CPU.
    cuda = {"device_id": str(device_id), "user_compute_stream": str(stream.ptr), "use_tf32": "0"}
    if cuda_graph:
        cuda["enable_cuda_graph"] = "1"
    return _create_session(ort, path, options, [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"])


def _create_session(ort, path: Path, options, providers):
    """ort.InferenceSession, with a model file it cannot load reported as ValueError naming the file
    (open_session_error). ONNX Runtime prints its provider-fallback notices with print(); they go to
    stderr so that stdout keeps only what the command writes there."""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            return ort.InferenceSession(str(path), options, providers=providers)
    except onnx_load_errors() as exc:
        error = open_session_error(path, exc)
        if error is None:
            raise
        raise error from exc


def run_options(device: str, graph_id: int = -1):
    """Run options of every decoder run: on CUDA, return as soon as the work is enqueued on the stream
    (the decode loop syncs once per round), and name the CUDA graph to capture/replay (-1: none;
    naming it also spares onnxruntime's Python wrapper a failed lookup per run)."""
    import onnxruntime as ort
    options = ort.RunOptions()
    if device == "cuda":
        options.add_run_config_entry("disable_synchronize_execution_providers", "1")
        options.add_run_config_entry("gpu_graph_id", str(graph_id))
    return options


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
        self.session = _inference_session(self._model_path(spec), device, stream, device_id, cuda_graph, cpu_threads)
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

    def _model_path(self, spec: ModelSpec) -> Path:
        """The ONNX file the session loads (sessions_static: a builder graph rewritten for its bindings)."""
        return spec.onnx_path

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
                device_ids=None):
        """Run S new columns through the model and append their keys/values to the cache.

        input_ids: [B, S] host ints; device_ids: optional [B, k] ints of the session's array module
            that replace the last k columns of input_ids (draft tokens stay on the device).
        new_mask: [B, S] host bool/int, 1 where the column is a real token of that row, 0 for a hole
            (padding, a finished request, a position past a request's draft length).
        positions: [B, S] host ints, each real token's index in its sequence (holes: anything in range).
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
