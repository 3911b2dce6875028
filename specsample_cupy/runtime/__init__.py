"""What the rest runs on: the kernels' compiler and launcher (kernel_runtime, with the codes and Philox
purposes it shares with kernels_cu/), where kernels_cu/ and models/ are (layout), pinned host memory,
and the models' ONNX Runtime sessions (sessions: folders and session creation; sessions_static: fixed
bindings and CUDA graphs; sessions_cache: the KV caches)."""
