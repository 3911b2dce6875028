"""Speculative-sampling verification: the public verify() and sample_tokens() (api, sampling), the CUDA
path (kernel_launch launches kernels_cu/verify.cu and its companions), the NumPy path that is both the CPU
implementation and the kernels' reference (cpu_numpy), top-k/top-p/min-p truncation, the baseline
method, each request's random stream (seeds) and closed-form distributions (analysis)."""
