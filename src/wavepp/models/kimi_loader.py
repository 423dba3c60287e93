"""Tensor names of a Kimi-Linear HF checkpoint (as released, and as transformers saves it).

    KDA layers   self_attn.{q,k,v}_proj -> attn.qkv_proj;  self_attn.{q,k,v}_conv1d [C, 1, taps] -> attn.conv_weight
                 self_attn.{f_a,f_b,g_a,g_b,b,o}_proj, dt_bias (fp32), A_log [1, 1, heads, 1], o_norm
    MLA layers   self_attn.{q,kv_a_proj_with_mqa,kv_b,o}_proj, kv_a_layernorm (no q LoRA, no RoPE)
    MLP          block_sparse_moe.{gate_proj, up_proj, down_proj} on dense layers;
                 block_sparse_moe.gate.{weight, e_score_correction_bias} (fp32), experts.{e}.{w1,w3,w2},
                 shared_experts.{gate,up,down}_proj on MoE layers
"""

from __future__ import annotations

import torch

from wavepp.models.config import StageSpec
from wavepp.models.loader import _EMBED, _LM_HEAD
from wavepp.models.moe_config import MoEModelConfig

_KEPT_FP32 = ("gate.weight", "e_score_correction_bias", "dt_bias")


def kimi_kept_in_fp32(name: str) -> bool:
    return name.endswith(_KEPT_FP32)


def kimi_tensor_shapes(config: MoEModelConfig, stage: StageSpec) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> expected shape, for every tensor the slice `stage` reads."""
    hidden = config.hidden_size
    shapes: dict[str, tuple[int, ...]] = {}
    if stage.is_first:
        shapes[_EMBED] = (config.vocab_size, hidden)
    for layer in range(stage.start_layer, stage.end_layer):
        p = f"model.layers.{layer}."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        a = p + "self_attn."
        if config.is_linear(layer):
            heads, d = config.linear_num_heads, config.linear_head_dim
            qkv = heads * d
            for x in "qkv":
                shapes[f"{a}{x}_proj.weight"] = (qkv, hidden)
                shapes[f"{a}{x}_conv1d.weight"] = (qkv, 1, config.linear_conv_kernel)
            shapes.update({a + "f_a_proj.weight": (d, hidden), a + "f_b_proj.weight": (qkv, d),
                           a + "dt_bias": (qkv,), a + "A_log": (1, 1, heads, 1), a + "b_proj.weight": (heads, hidden),
                           a + "g_a_proj.weight": (d, hidden), a + "g_b_proj.weight": (qkv, d),
                           a + "o_norm.weight": (d,), a + "o_proj.weight": (hidden, qkv)})
        else:
            heads = config.num_heads
            shapes.update({
                a + "q_proj.weight": (heads * config.qk_head_dim, hidden),
                a + "kv_a_proj_with_mqa.weight": (config.kv_lora_rank + config.qk_rope_head_dim, hidden),
                a + "kv_a_layernorm.weight": (config.kv_lora_rank,),
                a + "kv_b_proj.weight": (heads * (config.qk_nope_head_dim + config.v_head_dim), config.kv_lora_rank),
                a + "o_proj.weight": (hidden, heads * config.v_head_dim)})
        m = p + "block_sparse_moe."
        if not config.is_moe(layer):
            shapes.update(_swiglu(m, hidden, config.intermediate_size, ("gate_proj", "up_proj", "down_proj")))
            continue
        shapes.update({m + "gate.weight": (config.num_experts, hidden),
                       m + "gate.e_score_correction_bias": (config.num_experts,)})
        for e in range(config.num_experts):
            shapes.update(_swiglu(f"{m}experts.{e}.", hidden, config.moe_intermediate_size, ("w1", "w3", "w2")))
        if config.num_shared_experts:
            shapes.update(_swiglu(m + "shared_experts.", hidden,
                                  config.moe_intermediate_size * config.num_shared_experts,
                                  ("gate_proj", "up_proj", "down_proj")))
    if stage.is_last:
        shapes["model.norm.weight"] = (hidden,)
        shapes[_LM_HEAD] = (config.vocab_size, hidden)
    return shapes


def kimi_module_state(config: MoEModelConfig, stage: StageSpec, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF tensors -> the MoEStageModel state dict."""
    state = {}
    if stage.is_first:
        state["embed"] = t[_EMBED]
    for j, layer in enumerate(range(stage.start_layer, stage.end_layer)):
        p, m = f"model.layers.{layer}.", f"layers.{j}."
        a = p + "self_attn."
        state[m + "input_norm.weight"] = t[p + "input_layernorm.weight"]
        state[m + "post_attn_norm.weight"] = t[p + "post_attention_layernorm.weight"]
        if config.is_linear(layer):
            state[m + "attn.qkv_proj"] = torch.cat([t[f"{a}{x}_proj.weight"] for x in "qkv"])
            # conv_weight: [3 * qkv, taps], channels in q | k | v order as qkv_proj's rows
            state[m + "attn.conv_weight"] = torch.cat([t[f"{a}{x}_conv1d.weight"][:, 0] for x in "qkv"])
            state[m + "attn.A_log"] = t[a + "A_log"].flatten()
            state[m + "attn.o_norm_weight"] = t[a + "o_norm.weight"]
            state.update({m + f"attn.{x}": t[f"{a}{x}.weight"]
                          for x in ("f_a_proj", "f_b_proj", "b_proj", "g_a_proj", "g_b_proj", "o_proj")})
            state[m + "attn.dt_bias"] = t[a + "dt_bias"]
        else:
            names = {"q_proj": "q_proj.weight", "kv_a_proj": "kv_a_proj_with_mqa.weight",
                     "kv_a_norm.weight": "kv_a_layernorm.weight", "kv_b_proj": "kv_b_proj.weight",
                     "o_proj": "o_proj.weight"}
            state.update({m + "attn." + ours: t[a + theirs] for ours, theirs in names.items()})
        h, mm = p + "block_sparse_moe.", m + "mlp."
        if not config.is_moe(layer):
            state[mm + "gate_up_proj"] = torch.cat([t[h + "gate_proj.weight"], t[h + "up_proj.weight"]])
            state[mm + "down_proj"] = t[h + "down_proj.weight"]
            continue
        experts = range(config.num_experts)
        state.update({
            mm + "router.weight": t[h + "gate.weight"], mm + "router.bias": t[h + "gate.e_score_correction_bias"],
            # gate_up: [E, 2 * I, H], down: [E, H, I]
            mm + "experts.gate_up_proj": torch.stack([torch.cat([t[f"{h}experts.{e}.w1.weight"],
                                                                 t[f"{h}experts.{e}.w3.weight"]]) for e in experts]),
            mm + "experts.down_proj": torch.stack([t[f"{h}experts.{e}.w2.weight"] for e in experts]),
        })
        if config.num_shared_experts:
            s = h + "shared_experts."
            state[mm + "shared.gate_up_proj"] = torch.cat([t[s + "gate_proj.weight"], t[s + "up_proj.weight"]])
            state[mm + "shared.down_proj"] = t[s + "down_proj.weight"]
    if stage.is_last:
        state["norm.weight"] = t["model.norm.weight"]
        state["lm_head"] = t[_LM_HEAD]
    return state


def _swiglu(prefix: str, hidden: int, inter: int, names: tuple[str, str, str]) -> dict[str, tuple[int, ...]]:
    gate, up, down = names
    return {f"{prefix}{gate}.weight": (inter, hidden), f"{prefix}{up}.weight": (inter, hidden),
            f"{prefix}{down}.weight": (hidden, inter)}
