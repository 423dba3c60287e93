"""Option parsing the commands share. The pipeline's flags take their defaults from
EngineConfig's fields (`engine_default`), never a copy of them."""

from __future__ import annotations

import dataclasses

from wavepp.engine_config import DEVICES, DTYPES, KV_TIERS, EngineConfig
from wavepp.models.spec.layer_split import SPLIT_SETTINGS
from wavepp.sched.policy import runtime_policies


def engine_default(name: str):
    """The default of EngineConfig's field `name` (KeyError for a name it does not have)."""
    return {f.name: f.default for f in dataclasses.fields(EngineConfig)}[name]


def comma_list(text: str) -> list[str]:
    """The items of a comma-separated option: "a, b,,c" -> ["a", "b", "c"]."""
    return [t.strip() for t in text.split(",") if t.strip()]


def layer_split(text: str | None) -> list[int] | str | None:
    """--layer-split "14,16" -> [14, 16]; "auto" or "even" as they are; None or "" -> None
    (EngineConfig's default: auto where the model's layers differ). Anything else (a word
    among counts: "auto,3") is a ValueError naming the option."""
    if not text:
        return None
    if text.strip() in SPLIT_SETTINGS:
        return text.strip()
    try:
        return [int(t) for t in comma_list(text)]
    except ValueError:
        raise ValueError(
            f"--layer-split takes auto, even, or layer counts separated by commas, e.g. 14,16; "
            f"got {text!r}"
        ) from None


def add_pipeline_args(p) -> None:
    """--model, --pp (with --layer-split and --no-pin-cpus) and --policy: the pipeline that
    `wavepp prefill` and `wavepp serve` start."""
    model = engine_default("model")
    p.add_argument(
        "--model", default=model, help=f"built-in name or HF-format directory (default: {model})"
    )
    pp = engine_default("pp")
    p.add_argument(
        "--pp", type=int, default=pp, help=f"pipeline stages, one process each (default {pp})"
    )
    add_stage_args(p)
    policy, names = engine_default("policy"), runtime_policies()
    p.add_argument(
        "--policy",
        default=policy,
        choices=names,
        help=f"admission and wave planning (default {policy}): {', '.join(names)}",
    )
    order = engine_default("scheduling_policy")
    p.add_argument(
        "--scheduling-policy",
        default=order,
        choices=["fcfs", "priority"],
        help=f"the order of admission and of packing waves (default {order}): fcfs, by arrival; "
        "priority, by each request's `priority` (lower first, as vLLM's), then arrival, a "
        "waiting request gaining one level every --priority-aging-s",
    )
    aging = engine_default("priority_aging_s")
    p.add_argument(
        "--priority-aging-s",
        type=float,
        default=aging,
        help=f"under --scheduling-policy priority, seconds of waiting per level gained "
        f"(default {aging:g}): no request starves",
    )


def add_stage_args(p) -> None:
    """--layer-split and --no-pin-cpus, how the layers and CPUs are shared out among stages."""
    p.add_argument(
        "--layer-split",
        default=None,
        metavar="auto|even|N,N,...",
        help="layers per stage, comma separated; even: the count split; auto: the split whose "
        "slowest stage is fastest, from each layer's cost measured at start-up (default: auto "
        "where the model's layers differ, else even)",
    )
    p.add_argument(
        "--no-pin-cpus",
        dest="pin_cpus",
        action="store_false",
        default=None,
        help="leave the stage processes unpinned (default on the CPU: each stage pinned to "
        "CPUs of its own)",
    )


def add_engine_args(p) -> None:
    """--dtype, --block-size, --device, --stage-num-blocks, --host-kv-gib and
    --no-profile-waves: the options that `wavepp prefill` and `wavepp serve` share (see
    `engine_config`)."""
    p.add_argument("--dtype", default=engine_default("dtype"), choices=list(DTYPES))
    p.add_argument("--block-size", type=int, default=engine_default("block_size"))
    p.add_argument(
        "--device",
        default=engine_default("device"),
        choices=list(DEVICES),
        help="where stages compute: cpu, cuda (a GPU per stage where there are enough), "
        "auto (cuda when there is one); default cpu",
    )
    p.add_argument(
        "--stage-num-blocks",
        default=None,
        help="cache blocks per stage, comma separated (default: sized from the model)",
    )
    p.add_argument(
        "--host-kv-gib",
        type=float,
        default=engine_default("host_kv_gib"),
        help="each stage's host KV tier in GiB: evicted blocks kept in host memory and loaded "
        "back for a later prompt, with a hybrid model's state snapshots (default 0: none)",
    )
    p.add_argument(
        "--no-profile-waves",
        dest="profile_waves",
        action="store_false",
        help="skip the start-up profiling pass (it times waves of varied shape on every stage "
        "and starts the planner's cost model from their fit; about 15 s for SmolLM2 at pp 2 on "
        "a 2-core CPU): the planner starts from its prior and learns from the waves it runs, "
        "and --layer-split auto balances the layers' FLOPs instead of their measured times",
    )
    add_kv_tier_args(p)


def add_kv_tier_args(p) -> None:
    """--kv-tier, --kv-tier-master, --kv-tier-metadata, --kv-tier-segment-gib,
    --kv-tier-timeout-s: the KV tier
    every replica shares (engine_config.py `kv_tier`)."""
    p.add_argument(
        "--kv-tier",
        default=None,
        choices=list(KV_TIERS),
        help="a KV tier every replica shares: each stage puts the blocks it computes there and "
        "reuses what any replica with the same model, layer split and dtype put (default: none)",
    )
    p.add_argument(
        "--kv-tier-master",
        default=None,
        metavar="HOST:PORT",
        help="the store's master (mooncake_master's -rpc_port)",
    )
    p.add_argument(
        "--kv-tier-metadata",
        default=None,
        metavar="URL",
        help="the store's metadata server (default: the master's own, http://HOST:8080/metadata)",
    )
    p.add_argument(
        "--kv-tier-segment-gib",
        type=float,
        default=engine_default("kv_tier_segment_gib"),
        help="memory each stage lends to the shared store, in GiB (default %(default)s)",
    )
    p.add_argument(
        "--kv-tier-timeout-s",
        type=float,
        default=engine_default("kv_tier_timeout_s"),
        help="seconds a store lookup may go unanswered (its master unreachable) before the "
        "store counts as down and its hits are off for a while (default %(default)s)",
    )


def kv_tier_options(args) -> dict:
    """The EngineConfig options of add_kv_tier_args' flags."""
    return {
        "kv_tier": args.kv_tier,
        "kv_tier_master": args.kv_tier_master,
        "kv_tier_metadata": args.kv_tier_metadata,
        "kv_tier_segment_gib": args.kv_tier_segment_gib,
        "kv_tier_timeout_s": args.kv_tier_timeout_s,
    }


def stage_blocks(text: str | None) -> tuple[int, ...]:
    """--stage-num-blocks "40,64" -> (40, 64); None or "" -> () (sized from memory). A
    non-integer is a ValueError naming the option."""
    return tuple(_counts(text, "--stage-num-blocks", "block counts", "40,64")) if text else ()


def engine_config(args, model: str, **options):
    """The EngineConfig of a command's flags (add_engine_args, add_stage_args, --pp, --policy,
    --top-k) and its own `options`."""
    return EngineConfig(
        model,
        pp=args.pp,
        policy=args.policy,
        scheduling_policy=args.scheduling_policy,
        priority_aging_s=args.priority_aging_s,
        dtype=args.dtype,
        block_size=args.block_size,
        stage_num_blocks=stage_blocks(args.stage_num_blocks),
        top_k=args.top_k,
        device=args.device,
        layer_split=layer_split(args.layer_split),
        pin_cpus=args.pin_cpus,
        host_kv_gib=args.host_kv_gib,
        profile_waves=args.profile_waves,
        **kv_tier_options(args),
        **options,
    )


def _counts(text: str, option: str, noun: str, example: str) -> list[int]:
    """The integers of a comma-separated option; a non-integer is a ValueError naming it."""
    try:
        return [int(t) for t in comma_list(text)]
    except ValueError:
        raise ValueError(
            f"{option} takes {noun} separated by commas, e.g. {example}; got {text!r}"
        ) from None
