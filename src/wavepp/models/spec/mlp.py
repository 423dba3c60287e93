"""The MLP kinds a layer can have: a dense SwiGLU, or routed experts (MoE).

Routing (`MoESpec.scoring`):

    sigmoid  scores = sigmoid(x @ gate^T); the choice adds a score-correction bias (it picks,
             it never weighs); with n_group > 1 only the topk_group groups whose two best
             choices sum highest stay; weights = scores of the top-k, normalized to sum 1
             (norm_topk_prob), times routed_scaling_factor     (MiniMax-M2, DeepSeek-V3, GLM-5, Kimi)
    softmax  scores = softmax(x @ gate^T) in fp32; weights = the top-k scores, normalized to
             sum 1 where norm_topk_prob                           (Qwen3-MoE)

Pure Python: the modules are `layers/mlp.py` and `layers/moe.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from wavepp.models.spec.weights import MlpNames, Param, one, swiglu


@dataclass(frozen=True)
class DenseMLPSpec:
    intermediate_size: int
    kind = "dense"

    def __post_init__(self) -> None:
        if self.intermediate_size <= 0:
            raise ValueError(
                f"DenseMLPSpec.intermediate_size must be positive, got {self.intermediate_size}"
            )

    def flops_per_token(self, hidden: int) -> float:
        """gate, up and down projections (the cost model, spec/layer_cost.py)."""
        return 6 * hidden * self.intermediate_size

    def params(self, hf_layer: str, ours: str, hidden: int, names: MlpNames) -> list[Param]:
        return swiglu(ours, f"{hf_layer}{names.dense_block}.", hidden, self.intermediate_size)


@dataclass(frozen=True)
class MoESpec:
    num_experts: int
    top_k: int
    intermediate_size: int  # of one expert
    num_shared_experts: int = 0  # run densely, as one SwiGLU of num_shared * intermediate
    scoring: str = "sigmoid"
    score_bias: bool = True  # sigmoid routers: a score-correction bias
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    kind = "moe"

    def __post_init__(self) -> None:
        for name in ("num_experts", "top_k", "intermediate_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(
                    f"MoESpec.{name} must be a positive int, got {getattr(self, name)!r}"
                )
        if self.scoring not in ("sigmoid", "softmax"):
            raise ValueError(f"MoESpec.scoring {self.scoring!r} is not sigmoid or softmax")
        if self.num_experts % self.n_group or not 1 <= self.topk_group <= self.n_group:
            raise ValueError(
                f"num_experts={self.num_experts} must split into n_group={self.n_group} groups, "
                f"1 <= topk_group <= n_group"
            )
        if self.top_k > self.num_experts // self.n_group * self.topk_group:
            raise ValueError(
                f"num_experts_per_tok={self.top_k} is more than the experts of "
                f"{self.topk_group} groups"
            )

    def flops_per_token(self, hidden: int) -> float:
        """The router, then each token's `top_k` experts and the shared ones (the active
        parameters only: the cost model, spec/layer_cost.py)."""
        active = self.top_k + self.num_shared_experts
        return 2 * hidden * self.num_experts + 6 * hidden * self.intermediate_size * active

    def params(self, hf_layer: str, ours: str, hidden: int, names: MlpNames) -> list[Param]:
        block, experts, inter = (
            f"{hf_layer}{names.moe_block}.",
            range(self.num_experts),
            self.intermediate_size,
        )
        gate, up, down = names.expert
        params = [
            one(
                ours + "router.weight", block + "gate.weight", (self.num_experts, hidden), fp32=True
            )
        ]
        if self.score_bias:
            params.append(
                one(ours + "router.bias", block + names.router_bias, (self.num_experts,), fp32=True)
            )
        # gate_up: [E, 2 * I, H] from (gate_e | up_e); down: [E, H, I]
        pairs = []
        for e in experts:
            pairs += [
                (f"{block}experts.{e}.{gate}.weight", (inter, hidden)),
                (f"{block}experts.{e}.{up}.weight", (inter, hidden)),
            ]
        params.append(Param(ours + "experts.gate_up_proj", tuple(pairs), "stack_pairs"))
        params.append(
            Param(
                ours + "experts.down_proj",
                tuple((f"{block}experts.{e}.{down}.weight", (hidden, inter)) for e in experts),
                "stack",
            )
        )
        if self.num_shared_experts:
            params += swiglu(
                ours + "shared.", block + "shared_experts.", hidden, inter * self.num_shared_experts
            )
        return params


MLPSpec = DenseMLPSpec | MoESpec
