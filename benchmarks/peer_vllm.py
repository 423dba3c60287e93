"""The outside peer: vLLM's CPU build on exactly the bench's workload, printing the same columns.

Two steps, two virtual environments (vLLM's CPU build pins its own packages; keep it apart):

    # 1. with wavepp's venv: write the workload (token ids) and the model directory's path
    .venv/bin/python benchmarks/peer_vllm.py write --out /tmp/peer.json
    # 2. with a vLLM venv (README: "Against vLLM"): run it, best of the batch budgets
    /tmp/vllm-venv/bin/python benchmarks/peer_vllm.py run --workload /tmp/peer.json

The workload defaults to the README's comparison: short-suffix, 8 groups x 16 requests, a
1,536-token shared prefix and a 256-token suffix, SmolLM2-135M in bf16, the first token only,
all requests submitted at once. vLLM runs with prefix caching on, `max_tokens=1`, on both
cores (VLLM_CPU_OMP_THREADS_BIND=0-1, nothing reserved), each `max_num_batched_tokens` in its
own process after a warm-up on unrelated prompts; the table shows every budget and its best.
Step 2 imports nothing from wavepp.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time


def write_workload(args) -> None:
    from wavepp.models import load_model_config
    from wavepp.model_store import resolve_model
    from wavepp.workloads import make_workload

    path = resolve_model(args.model)
    vocab = load_model_config(path).vocab_size
    wl = make_workload("short_suffix", num_requests=args.num_groups * args.per_group,
                       num_groups=args.num_groups, prefix_len=args.prefix_len, suffix_len=args.suffix_len,
                       vocab_size=vocab, seed=args.seed)
    with open(args.out, "w") as f:
        json.dump({"model": str(path), "name": wl.name, "prompts": [list(p) for p in wl.prompts],
                   "ideal_hit_rate": wl.ideal_hit_rate}, f)
    print(f"wrote {len(wl.prompts)} prompts ({sum(map(len, wl.prompts)):,} tokens, ideal hit rate "
          f"{wl.ideal_hit_rate:.1%}) of {path} to {args.out}")


def run_all(args) -> None:
    rows = []
    for budget in args.budgets:
        env = dict(os.environ, VLLM_CPU_NUM_OF_RESERVED_CPU="0", VLLM_CPU_OMP_THREADS_BIND=args.bind)
        proc = subprocess.run([sys.executable, __file__, "one", "--workload", args.workload,
                               "--budget", str(budget), "--memory-fraction", str(args.memory_fraction),
                               "--dtype", args.dtype],
                              env=env, capture_output=True, text=True)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not line:
            print(f"max_num_batched_tokens {budget}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
            continue
        rows.append(json.loads(line[-1][len("RESULT "):]))
    print(f"machine: {_cpu_name()}; vLLM CPU build, bind {args.bind}, dtype {args.dtype}")
    print(f"{'max_num_batched_tokens':>22} {'input tok/s':>12} {'computed tok/s':>15} {'hit':>6} {'seconds':>8}")
    for r in rows:
        print(f"{r['budget']:>22} {r['input_tok_s']:>12,.0f} {r['computed_tok_s']:>15,.0f} "
              f"{r['hit_rate']:>6.1%} {r['seconds']:>8.2f}")
    if rows:
        best = max(rows, key=lambda r: r["input_tok_s"])
        print(f"best: max_num_batched_tokens {best['budget']}: {best['input_tok_s']:,.0f} input tok/s")


def run_one(args) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    with open(args.workload) as f:
        spec = json.load(f)
    prompts = spec["prompts"]
    longest = max(map(len, prompts))
    llm = LLM(model=spec["model"], dtype=args.dtype, enable_prefix_caching=True,
              max_num_batched_tokens=args.budget, max_model_len=max(longest + 16, args.budget),
              max_num_seqs=len(prompts), gpu_memory_utilization=args.memory_fraction)
    params = SamplingParams(max_tokens=1)
    warm = [TokensPrompt(prompt_token_ids=[(7 * i + j) % 1000 + 1 for j in range(64)]) for i in range(4)]
    llm.generate(warm, params, use_tqdm=False)
    start = time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    total = sum(map(len, prompts))
    cached = sum(o.num_cached_tokens or 0 for o in outputs)
    print("RESULT " + json.dumps({"budget": args.budget, "seconds": seconds, "input_tok_s": total / seconds,
                                  "computed_tok_s": (total - cached) / seconds,
                                  "hit_rate": cached / total}))


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    w = sub.add_parser("write", help="(wavepp's venv) write the workload's token ids")
    w.add_argument("--out", required=True)
    w.add_argument("--model", default="smollm2")
    w.add_argument("--num-groups", type=int, default=8)
    w.add_argument("--per-group", type=int, default=16)
    w.add_argument("--prefix-len", type=int, default=1536)
    w.add_argument("--suffix-len", type=int, default=256)
    w.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("run", help="(vLLM's venv) run every budget, each in its own process")
    r.add_argument("--workload", required=True)
    r.add_argument("--budgets", type=lambda s: [int(x) for x in s.split(",")], default=[256, 512, 2048])
    r.add_argument("--bind", default="0-1", help="VLLM_CPU_OMP_THREADS_BIND (default: both cores)")
    r.add_argument("--memory-fraction", type=float, default=0.3,
                   help="of the NUMA node's memory for vLLM (its gpu_memory_utilization; default 0.3)")
    o = sub.add_parser("one", help="(internal) one budget")
    o.add_argument("--workload", required=True)
    o.add_argument("--budget", type=int, required=True)
    o.add_argument("--memory-fraction", type=float, default=0.3)
    for step in (r, o):
        # bfloat16 as the bench runs it; float32 where the CPU has no bf16 arithmetic (AVX2 only:
        # vLLM's bf16 path ran 31 computed tok/s on SmolLM2 there, a fifth of its fp32's 162)
        step.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    args = parser.parse_args()
    {"write": write_workload, "run": run_all, "one": run_one}[args.step](args)


if __name__ == "__main__":
    main()
