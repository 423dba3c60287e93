"""Kimi delta attention (KDA): a gated delta rule with a per-channel decay, scanned in chunks.

Per head, the state S [dk, dv] (fp32) follows, token by token (q, k L2-normalized, q scaled
by dk^-1/2, g <= 0 a per-channel log decay, beta in (0, 1)):

    S' = diag(exp(g_t)) S                       decay
    u  = beta_t (v_t - S'^T k_t)                 what the state gets wrong about v_t
    S  = S' + k_t u^T                            delta-rule write
    o_t = S^T q_t

Chunked over C tokens with the cumulative decay G_t = g_1 + ... + g_t inside the chunk and
S0 the state before it, the corrections u of the chunk solve one unit lower-triangular system

    (I + A) U = beta V - beta (K * e^G) S0,   A[t, s] = beta_t sum_c k_t[c] k_s[c] e^(G_t - G_s)[c], s < t

and then   O = (Q * e^G) S0 + (M * mask(s <= t)) U,   M[t, s] = sum_c q_t[c] k_s[c] e^(G_t - G_s)[c]
           S_C = e^(G_C) S0 + sum_s (k_s * e^(G_C - G_s)) u_s^T

Exact in exact arithmetic at any chunk length, so a scan split at any position (a snapshot
boundary) gives the same outputs as one unsplit scan up to fp32 rounding.
"""

from __future__ import annotations

import torch

SCAN_CHUNK = 64  # tokens per triangular solve: [C, C, dk] decay factors per head


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum x^2 + eps) over the last dim (eps inside the root, as the reference kernels)."""
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + eps)


def kda_scan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk: int = SCAN_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's scan, all fp32 (q and k already normalized and q scaled).

    q, k, g: [heads, n, dk]; v: [heads, n, dv]; beta: [heads, n]; state: [heads, dk, dv].
    Returns (o [heads, n, dv], the state after the n tokens [heads, dk, dv]). Does not modify
    `state`.
    """
    heads, n, dk = k.shape
    outputs = []
    for start in range(0, n, chunk):
        end = min(start + chunk, n)
        o, state = _scan_chunk(
            q[:, start:end],
            k[:, start:end],
            v[:, start:end],
            g[:, start:end],
            beta[:, start:end],
            state,
        )
        outputs.append(o)
    if not outputs:
        return v.new_zeros(heads, 0, v.shape[-1]), state.clone()
    return torch.cat(outputs, dim=1), state


def _scan_chunk(q, k, v, g, beta, state):
    # q, k, g: [h, c, dk]; v: [h, c, dv]; beta: [h, c]; state: [h, dk, dv]
    c = k.shape[1]
    G = g.cumsum(dim=1)  # [h, c, dk]
    strict = torch.ones(c, c, dtype=torch.bool, device=k.device).tril_(-1)  # s < t
    causal = torch.ones(c, c, dtype=torch.bool, device=k.device).tril_()  # s <= t
    # decay[t, s] = e^(G_t - G_s) for s <= t (exponent <= 0), 0 above the diagonal
    diff = (G[:, :, None, :] - G[:, None, :, :]).masked_fill_(
        ~causal[None, :, :, None], float("-inf")
    )
    decay = diff.exp_()  # [h, c, c, dk]
    kk = torch.einsum("htc,hsc,htsc->hts", k, k, decay)  # [h, c, c]
    A = (beta[:, :, None] * kk).masked_fill_(~strict, 0.0)
    eye = torch.eye(c, dtype=q.dtype, device=q.device).expand(A.shape[0], c, c)
    eG = G.exp()
    rhs = beta[:, :, None] * (v - (k * eG) @ state)  # [h, c, dv]
    u = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
    qk = torch.einsum("htc,hsc,htsc->hts", q, k, decay).masked_fill_(~causal, 0.0)
    o = (q * eG) @ state + qk @ u  # [h, c, dv]
    tail = (G[:, -1:, :] - G).exp()  # e^(G_C - G_s): [h, c, dk]
    new_state = eG[:, -1, :, None] * state + (k * tail).transpose(1, 2) @ u
    return o, new_state
