"""GPT-2-style decoder in torch whose parameter names and layouts match
``models.export_onnx`` (Conv1D layout: y = x @ W + b), so exporting is just
``{name: tensor.numpy()}``. Training only; nothing at run time imports torch.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, n_head: int, eps: float):
        super().__init__()
        self.n_head, self.eps = n_head, eps
        self.ln_1 = nn.LayerNorm(d, eps=eps)
        self.ln_2 = nn.LayerNorm(d, eps=eps)
        self.attn = nn.Module()
        self.attn.c_attn = _Conv1D(d, 3 * d)
        self.attn.c_proj = _Conv1D(d, d)
        self.mlp = nn.Module()
        self.mlp.c_fc = _Conv1D(d, 4 * d)
        self.mlp.c_proj = _Conv1D(4 * d, d)

    def forward(self, x):
        B, S, D = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(D, dim=-1)
        heads = lambda t: t.view(B, S, self.n_head, D // self.n_head).transpose(1, 2)  # noqa
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        x = x + self.attn.c_proj(y.transpose(1, 2).reshape(B, S, D))
        h = F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh")
        return x + self.mlp.c_proj(h)


class _Conv1D(nn.Module):
    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.02)
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(
            *x.shape[:-1], -1)


class GPT(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        self.config = dict(config)
        V, P, D = config["vocab_size"], config["n_positions"], config["n_embd"]
        eps = config.get("layer_norm_epsilon", 1e-5)
        self.wte = nn.Parameter(torch.randn(V, D) * 0.02)
        self.wpe = nn.Parameter(torch.randn(P, D) * 0.01)
        self.h = nn.ModuleList(Block(D, config["n_head"], eps) for _ in range(config["n_layer"]))
        self.ln_f = nn.LayerNorm(D, eps=eps)
        # GPT-2's scaled init of the residual projections keeps deep stacks stable.
        for blk in self.h:
            for lin in (blk.attn.c_proj, blk.mlp.c_proj):
                nn.init.normal_(lin.weight, std=0.02 / math.sqrt(2 * config["n_layer"]))

    def forward(self, ids):
        S = ids.shape[1]
        x = self.wte[ids] + self.wpe[:S]
        for blk in self.h:
            x = blk(x)
        return self.ln_f(x) @ self.wte.T

    def numpy_weights(self) -> dict[str, np.ndarray]:
        return {k: v.detach().float().cpu().numpy() for k, v in self.state_dict().items()}

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
