"""Speculative decoding: SpeculativeDecoder (decoder), its two loops (host_loop: the algorithm step by
step on the host, any device; device_loop: the whole round on the GPU), the proposers (draft model or
n-gram lookup), the γ policy and its cost model, the batch's request state, continuous batching, stop
strings and detokenizing."""
