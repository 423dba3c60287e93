"""The KDA layer of Kimi-Linear: projections, short convolution, gates and the delta-rule scan.

    x ─ qkv_proj ─ [q | k | v] ─ causal depthwise conv (conv_kernel taps) ─ silu ─ q, k, v
    x ─ f_a_proj ─ f_b_proj ─ + dt_bias ─ -exp(A_log) * softplus ─ g   (per-channel log decay)
    x ─ b_proj ─ sigmoid ─ beta                                        (per-head write strength)
    kda_scan(l2(q) / sqrt(dk), l2(k), v, g, beta, state) ─ o
    o ─ RMSNorm * sigmoid(g_b_proj(g_a_proj(x))) ─ o_proj

What a sequence carries from one chunk to the next, per layer (a *snapshot* when saved):

    recurrent  [heads, dk, dv] fp32        the delta-rule state
    conv       [conv_kernel - 1, 3 * qkv]   the last inputs of the convolution, model dtype
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from wavepp.models.layers.context import ForwardContext
from wavepp.models.layers.kda_scan import kda_scan, l2_normalize
from wavepp.models.spec import KDASpec


class KimiDeltaAttention(nn.Module):
    def __init__(self, spec: KDASpec, layer: int, hidden_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.layer = layer
        self.heads, self.head_dim = spec.num_heads, spec.head_dim
        self.qkv = spec.qkv_size
        self.taps = spec.conv_kernel
        self.eps = spec.norm_eps
        hidden, qkv, d = hidden_size, self.qkv, self.head_dim
        self.qkv_proj = _param(dtype, 3 * qkv, hidden)
        self.conv_weight = _param(dtype, 3 * qkv, self.taps)
        self.f_a_proj = _param(dtype, d, hidden)
        self.f_b_proj = _param(dtype, qkv, d)
        self.dt_bias = _param(torch.float32, qkv)  # kept fp32, as the checkpoint keeps it
        self.A_log = _param(dtype, self.heads)
        self.b_proj = _param(dtype, self.heads, hidden)
        self.g_a_proj = _param(dtype, d, hidden)
        self.g_b_proj = _param(dtype, qkv, d)
        self.o_norm_weight = _param(dtype, d)
        self.o_proj = _param(dtype, hidden, qkv)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """x: [n, hidden] -> [n, hidden]. Reads each chunk's starting state from its `state_in`
        slot (zeros if None) and writes the states of its `state_saves` into the cache."""
        n, heads, d = x.shape[0], self.heads, self.head_dim
        batch, pools, linear = ctx.batch, ctx.cache, ctx.kernels.project
        mixed = linear(x, self.qkv_proj)  # [n, 3 * qkv]
        # g: [n, heads, d] fp32, <= 0
        g = linear(linear(x, self.f_a_proj), self.f_b_proj).float() + self.dt_bias
        g = -self.A_log.float().exp()[:, None] * F.softplus(g.view(n, heads, d), threshold=20.0)
        beta = torch.sigmoid(linear(x, self.b_proj)).float()  # [n, heads]
        recurrent = pools.state_view("recurrent", self.layer)  # [slots, heads * d * d]
        conv_state = pools.state_view("conv", self.layer)  # [slots, (taps - 1) * 3qkv]
        out = torch.empty(n, heads, d, dtype=x.dtype, device=x.device)
        for index, chunk in enumerate(batch.chunks):
            t0, t1 = batch.token_starts[index], batch.token_starts[index + 1]
            if chunk.state_in is None:
                state = torch.zeros(heads, d, d, device=x.device)
                history = mixed.new_zeros(self.taps - 1, 3 * self.qkv)
            else:
                state = recurrent[chunk.state_in].view(heads, d, d).clone()
                history = conv_state[chunk.state_in].view(self.taps - 1, 3 * self.qkv)
            # window: [taps - 1 + m, 3qkv]  |  history (positions before the chunk) | chunk's inputs
            window = torch.cat((history, mixed[t0:t1]))
            qkv = self._conv(window)  # [m, 3qkv]
            q, k, v = (
                t.float().view(-1, heads, d).transpose(0, 1) for t in qkv.split(self.qkv, -1)
            )
            q, k = l2_normalize(q) * d**-0.5, l2_normalize(k)
            gc, bc = g[t0:t1].transpose(0, 1), beta[t0:t1].t()
            # the scan splits at every save: [start, p1) | [p1, p2) | ... | [p_last, end)
            start = chunk.num_cached_tokens
            for position, slot in (*chunk.state_saves, (chunk.end, None)):
                a, b = start - chunk.num_cached_tokens, position - chunk.num_cached_tokens
                if b > a:
                    o, state = kda_scan(
                        q[:, a:b], k[:, a:b], v[:, a:b], gc[:, a:b], bc[:, a:b], state
                    )
                    out[t0 + a : t0 + b] = o.transpose(0, 1).to(x.dtype)
                if slot is not None:
                    recurrent[slot] = state.flatten()
                    # the last taps - 1 inputs before `position`: window rows [b, b + taps - 1)
                    conv_state[slot] = window[b : b + self.taps - 1].flatten()
                start = position
        gate = linear(linear(x, self.g_a_proj), self.g_b_proj).view(n, heads, d)
        o = out.float()
        o = (
            o
            * torch.rsqrt(o.square().mean(-1, keepdim=True) + self.eps)
            * self.o_norm_weight.float()
        )
        o = (o * torch.sigmoid(gate.float())).to(x.dtype)
        return linear(o.view(n, heads * d), self.o_proj)

    def _conv(self, window: torch.Tensor) -> torch.Tensor:
        # window: [taps - 1 + m, C] -> [m, C]: out[t] = silu(sum_j w[:, j] * window[t + j]),
        # as one contraction over the taps of each position's window ([m, C, taps], a view):
        # a matmul on every device (F.conv1d on a GPU is cuDNN's, which may run fp32 as TF32)
        out = torch.einsum("mct,ct->mc", window.unfold(0, self.taps, 1), self.conv_weight)
        return F.silu(out)


def _param(dtype: torch.dtype, *shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)
