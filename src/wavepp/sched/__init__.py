"""Leader logic, pure Python: admission rounds, wave planning, policies, cost model."""

from wavepp.sched.admission import AdmissionRound, RoundOutcome, agree_prefix
from wavepp.sched.cost_model import CostCoefficients, CostModel
from wavepp.sched.leader import Leader, LeaderConfig
from wavepp.sched.messages import (
    Chunk,
    Hint,
    ItemResult,
    LeaseItem,
    LeaseMsg,
    LeaseReply,
    ProbeItem,
    ProbeMsg,
    ProbeReply,
    PromptLogprobs,
    ReleaseMsg,
    TokenResult,
    Wave,
    WaveResult,
)
from wavepp.sched.planners import (
    PLANNERS,
    Admitting,
    BalancedPlanner,
    DynamicChunkPlanner,
    MpuPlanner,
    PlannerConfig,
    StaticPlanner,
    budget_ladder,
    make_planner,
)
from wavepp.sched.policy import POLICIES, Policy, get_policy
from wavepp.sched.request import Dependency, Request, RequestState
from wavepp.sched.stage_server import PlanMismatchError, PreparedChunk, StageServer

__all__ = [
    "AdmissionRound",
    "RoundOutcome",
    "agree_prefix",
    "CostCoefficients",
    "CostModel",
    "Leader",
    "LeaderConfig",
    "DynamicChunkPlanner",
    "Chunk",
    "Hint",
    "ItemResult",
    "LeaseItem",
    "LeaseMsg",
    "LeaseReply",
    "ProbeItem",
    "ProbeMsg",
    "ProbeReply",
    "PromptLogprobs",
    "ReleaseMsg",
    "TokenResult",
    "Wave",
    "WaveResult",
    "PLANNERS",
    "Admitting",
    "BalancedPlanner",
    "MpuPlanner",
    "PlannerConfig",
    "StaticPlanner",
    "budget_ladder",
    "make_planner",
    "POLICIES",
    "Policy",
    "get_policy",
    "Dependency",
    "Request",
    "RequestState",
    "PlanMismatchError",
    "PreparedChunk",
    "StageServer",
]
