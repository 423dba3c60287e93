"""`wavepp prefill`: first tokens of prompts, through the pipeline."""

from __future__ import annotations

import json
import sys
import time

from wavepp.cli.args import add_engine_args, add_pipeline_args, engine_config, engine_default


def add_parser(sub) -> None:
    p = sub.add_parser(
        "prefill",
        help="prefill prompts through the pipeline; print first tokens",
        description="Prefill prompts and print each one's first token and logprob. "
        "Under torchrun (one rank per stage, any number of nodes) rank 0 "
        "prints and the other ranks serve their stage.",
    )
    p.add_argument("prompts", nargs="*", metavar="PROMPT", help="prompt texts")
    p.add_argument("--token-ids", metavar="FILE", help="a JSON list of token-id lists")
    add_pipeline_args(p)
    add_engine_args(p)
    p.add_argument(
        "--top-k",
        type=int,
        default=engine_default("top_k"),
        help="top logprobs printed per first token (default %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON list, one object per prompt")
    p.set_defaults(func=run)


def run(args) -> int:
    from wavepp.runtime import torchrun_rank

    ranks = torchrun_rank()
    if ranks is not None and ranks[0] != 0:
        return serve_stage(ranks, args.device)
    prompts = list(args.prompts)
    if args.token_ids:
        with open(args.token_ids) as f:
            ids = json.load(f)
        if not isinstance(ids, list) or not all(isinstance(p, list) for p in ids):
            raise ValueError(f"{args.token_ids}: expected a JSON list of token-id lists")
        prompts += ids
    if not prompts:
        raise ValueError("no prompts: give PROMPT texts or --token-ids FILE")
    from wavepp.engine import Engine

    config = engine_config(args, args.model)
    t0 = time.perf_counter()
    with Engine(config) as engine:
        prompts = [engine.tokenize(p) for p in prompts]  # the tokenizer loads outside the timing
        t1 = time.perf_counter()
        results = engine.prefill(prompts)
        t2 = time.perf_counter()
    if args.json:
        json.dump([r.to_dict() for r in results], sys.stdout, indent=1)
        print()
        return 0 if all(r.ok for r in results) else 1
    for i, r in enumerate(results):
        if r.ok:
            text = f" {r.first_token_text!r}" if r.first_token_text is not None else ""
            print(
                f"[{i}] {r.num_prompt_tokens} tokens ({r.num_cached_tokens} cached) -> "
                f"first token {r.first_token_id}{text} logprob {r.first_token_logprob:.4f} "
                f"ttft {1e3 * r.ttft_s:.1f} ms"
            )
        else:
            print(f"[{i}] failed: {r.error}")
    n = sum(r.num_prompt_tokens for r in results)
    print(
        f"{len(results)} prompts, {n} tokens in {t2 - t1:.3f} s ({n / (t2 - t1):.0f} tok/s); "
        f"start-up {t1 - t0:.1f} s; pp={args.pp} policy={args.policy} dtype={args.dtype}"
    )
    return 0 if all(r.ok for r in results) else 1


def serve_stage(ranks, device: str = "cpu") -> int:
    """A non-zero torchrun rank: serve this stage until rank 0 shuts the pipeline down. Every
    rank runs the same command, so `device` (the --device argument) and the data plane's
    backend derived from it are rank 0's as well; the stage checks them against rank 0's."""
    from wavepp.runtime import Channels, run_worker
    from wavepp.runtime.device import default_backend, resolve_device, stage_device
    from wavepp.runtime.launch import torchrun_local_rank

    rank, world = ranks
    device = resolve_device(device)
    channels = Channels(
        rank,
        world,
        default_backend(device, world),
        init_method="env://",
        device=stage_device(device, torchrun_local_rank()),
    )
    run_worker(channels)
    channels.close()
    return 0
