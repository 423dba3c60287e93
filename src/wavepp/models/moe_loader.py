"""Load one stage's slice of a MiniMax-M2 / DeepSeek-V3 / GLM-5 HF checkpoint.

Only the slice's tensors are read. HF names map onto the stage's modules; per-expert tensors
are stacked, gate and up fused:

    minimax_m2   self_attn.{q,k,v}_proj                      -> attn.qkv_proj
                 block_sparse_moe.gate / e_score_correction_bias -> mlp.router.weight / bias (fp32)
                 block_sparse_moe.experts.{e}.{w1|w3, w2}     -> mlp.experts.{gate_up, down}_proj[e]
    deepseek_v3  self_attn.{q_a,q_b,kv_a_proj_with_mqa,kv_b,o}_proj, q_a/kv_a_layernorm -> attn.*
    glm_moe_dsa  mlp.gate.{weight, e_score_correction_bias}   -> mlp.router.{weight, bias} (fp32)
                 mlp.experts.{e}.{gate,up,down}_proj, mlp.shared_experts.* -> mlp.experts / mlp.shared
                 self_attn.indexer.{wq_b, wk, k_norm, weights_proj (fp32)} -> attn.indexer.* (GLM-5)
"""

from __future__ import annotations

from pathlib import Path

import torch

from wavepp.models.config import StageSpec
from wavepp.models.loader import _EMBED, _LM_HEAD, read_tensors
from wavepp.models.moe_config import MoEModelConfig
from wavepp.models.moe_stage_model import MoEStageModel


def load_moe_stage_model(model_path: str | Path, config: MoEModelConfig, stage: StageSpec,
                         dtype: torch.dtype) -> MoEStageModel:
    if config.is_hybrid:
        from wavepp.models.kimi_loader import kimi_kept_in_fp32, kimi_module_state, kimi_tensor_shapes
        shapes, kept_fp32, module_state = kimi_tensor_shapes(config, stage), kimi_kept_in_fp32, kimi_module_state
    else:
        shapes, kept_fp32, module_state = moe_tensor_shapes(config, stage), _kept_in_fp32, _module_state
    fp32 = {name: shape for name, shape in shapes.items() if kept_fp32(name)}
    aliases = {_LM_HEAD: _EMBED} if config.tie_word_embeddings else {}
    tensors = read_tensors(model_path, {n: s for n, s in shapes.items() if n not in fp32}, dtype, aliases)
    tensors.update(read_tensors(model_path, fp32, torch.float32))
    model = MoEStageModel(config, stage, dtype)
    model.load_state_dict(module_state(config, stage, tensors), strict=True, assign=True)
    return model.eval()


def moe_tensor_shapes(config: MoEModelConfig, stage: StageSpec) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> expected shape, for every tensor the slice `stage` reads."""
    hidden = config.hidden_size
    shapes: dict[str, tuple[int, ...]] = {}
    if stage.is_first:
        shapes[_EMBED] = (config.vocab_size, hidden)
    for layer in range(stage.start_layer, stage.end_layer):
        p = f"model.layers.{layer}."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        shapes.update(_attention_shapes(config, layer, p + "self_attn."))
        shapes.update(_mlp_shapes(config, layer, p))
    if stage.is_last:
        shapes["model.norm.weight"] = (hidden,)
        shapes[_LM_HEAD] = (config.vocab_size, hidden)
    return shapes


def _attention_shapes(config: MoEModelConfig, layer: int, a: str) -> dict[str, tuple[int, ...]]:
    hidden, heads = config.hidden_size, config.num_heads
    if not config.is_mla:
        q, kv = heads * config.head_dim, config.num_kv_heads * config.head_dim
        return {a + "q_proj.weight": (q, hidden), a + "k_proj.weight": (kv, hidden),
                a + "v_proj.weight": (kv, hidden), a + "o_proj.weight": (hidden, q),
                a + "q_norm.weight": (q,), a + "k_norm.weight": (kv,)}
    shapes = {a + "kv_a_proj_with_mqa.weight": (config.kv_lora_rank + config.qk_rope_head_dim, hidden),
              a + "kv_a_layernorm.weight": (config.kv_lora_rank,),
              a + "kv_b_proj.weight": (heads * (config.qk_nope_head_dim + config.v_head_dim), config.kv_lora_rank),
              a + "o_proj.weight": (hidden, heads * config.v_head_dim)}
    if config.q_lora_rank:
        shapes.update({a + "q_a_proj.weight": (config.q_lora_rank, hidden),
                       a + "q_a_layernorm.weight": (config.q_lora_rank,),
                       a + "q_b_proj.weight": (heads * config.qk_head_dim, config.q_lora_rank)})
    else:
        shapes[a + "q_proj.weight"] = (heads * config.qk_head_dim, hidden)
    if config.runs_indexer(layer):
        i, dim = a + "indexer.", config.index_head_dim
        shapes.update({i + "wq_b.weight": (config.index_n_heads * dim, config.q_lora_rank),
                       i + "wk.weight": (dim, hidden), i + "k_norm.weight": (dim,), i + "k_norm.bias": (dim,),
                       i + "weights_proj.weight": (config.index_n_heads, hidden)})
    return shapes


def _mlp_shapes(config: MoEModelConfig, layer: int, p: str) -> dict[str, tuple[int, ...]]:
    hidden, inter, experts = config.hidden_size, config.moe_intermediate_size, config.num_experts
    if not config.is_moe(layer):
        return _swiglu_shapes(p + "mlp.", hidden, config.intermediate_size, ("gate_proj", "up_proj", "down_proj"))
    if config.model_type == "minimax_m2":
        m = p + "block_sparse_moe."
        shapes = {m + "gate.weight": (experts, hidden), m + "e_score_correction_bias": (experts,)}
        for e in range(experts):
            shapes.update(_swiglu_shapes(f"{m}experts.{e}.", hidden, inter, ("w1", "w3", "w2")))
        return shapes
    m = p + "mlp."
    shapes = {m + "gate.weight": (experts, hidden), m + "gate.e_score_correction_bias": (experts,)}
    for e in range(experts):
        shapes.update(_swiglu_shapes(f"{m}experts.{e}.", hidden, inter, ("gate_proj", "up_proj", "down_proj")))
    if config.num_shared_experts:
        shapes.update(_swiglu_shapes(m + "shared_experts.", hidden, inter * config.num_shared_experts,
                                     ("gate_proj", "up_proj", "down_proj")))
    return shapes


def _swiglu_shapes(prefix: str, hidden: int, inter: int, names: tuple[str, str, str]) -> dict:
    gate, up, down = names
    return {f"{prefix}{gate}.weight": (inter, hidden), f"{prefix}{up}.weight": (inter, hidden),
            f"{prefix}{down}.weight": (hidden, inter)}


def _kept_in_fp32(name: str) -> bool:
    # routers and the indexer's head weights make discrete choices: fp32 in any model dtype
    return name.endswith(("gate.weight", "e_score_correction_bias", "indexer.weights_proj.weight"))


def _module_state(config: MoEModelConfig, stage: StageSpec, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF tensors -> the MoEStageModel state dict."""
    state = {}
    if stage.is_first:
        state["embed"] = t[_EMBED]
    for j, layer in enumerate(range(stage.start_layer, stage.end_layer)):
        p, m = f"model.layers.{layer}.", f"layers.{j}."
        a = p + "self_attn."
        state[m + "input_norm.weight"] = t[p + "input_layernorm.weight"]
        state[m + "post_attn_norm.weight"] = t[p + "post_attention_layernorm.weight"]
        if not config.is_mla:
            state[m + "attn.qkv_proj"] = torch.cat([t[f"{a}{x}_proj.weight"] for x in "qkv"])
            state[m + "attn.o_proj"] = t[a + "o_proj.weight"]
            state[m + "attn.q_norm.weight"] = t[a + "q_norm.weight"]
            state[m + "attn.k_norm.weight"] = t[a + "k_norm.weight"]
        else:
            names = {"kv_a_proj": "kv_a_proj_with_mqa.weight", "kv_a_norm.weight": "kv_a_layernorm.weight",
                     "kv_b_proj": "kv_b_proj.weight", "o_proj": "o_proj.weight"}
            if config.q_lora_rank:
                names.update({"q_a_proj": "q_a_proj.weight", "q_a_norm.weight": "q_a_layernorm.weight",
                              "q_b_proj": "q_b_proj.weight"})
            else:
                names["q_proj"] = "q_proj.weight"
            if config.runs_indexer(layer):
                names.update({"indexer.wq_b": "indexer.wq_b.weight", "indexer.wk": "indexer.wk.weight",
                              "indexer.k_norm_weight": "indexer.k_norm.weight",
                              "indexer.k_norm_bias": "indexer.k_norm.bias",
                              "indexer.weights_proj": "indexer.weights_proj.weight"})
            state.update({m + "attn." + ours: t[a + theirs] for ours, theirs in names.items()})
        state.update(_mlp_state(config, layer, p, m + "mlp.", t))
    if stage.is_last:
        state["norm.weight"] = t["model.norm.weight"]
        state["lm_head"] = t[_LM_HEAD]
    return state


def _mlp_state(config: MoEModelConfig, layer: int, p: str, m: str, t: dict) -> dict[str, torch.Tensor]:
    if not config.is_moe(layer):
        return _swiglu_state(p + "mlp.", m, t, ("gate_proj", "up_proj", "down_proj"))
    if config.model_type == "minimax_m2":
        hf, names, bias = p + "block_sparse_moe.", ("w1", "w3", "w2"), "e_score_correction_bias"
    else:
        hf, names, bias = p + "mlp.", ("gate_proj", "up_proj", "down_proj"), "gate.e_score_correction_bias"
    gate, up, down = names
    experts = range(config.num_experts)
    state = {
        m + "router.weight": t[hf + "gate.weight"], m + "router.bias": t[hf + bias],
        # gate_up: [E, 2 * I, H], down: [E, H, I]
        m + "experts.gate_up_proj": torch.stack([torch.cat([t[f"{hf}experts.{e}.{gate}.weight"],
                                                            t[f"{hf}experts.{e}.{up}.weight"]]) for e in experts]),
        m + "experts.down_proj": torch.stack([t[f"{hf}experts.{e}.{down}.weight"] for e in experts]),
    }
    if config.num_shared_experts:
        state.update(_swiglu_state(hf + "shared_experts.", m + "shared.", t, names))
    return state


def _swiglu_state(hf: str, m: str, t: dict, names: tuple[str, str, str]) -> dict[str, torch.Tensor]:
    gate, up, down = names
    return {m + "gate_up_proj": torch.cat([t[f"{hf}{gate}.weight"], t[f"{hf}{up}.weight"]]),
            m + "down_proj": t[f"{hf}{down}.weight"]}
