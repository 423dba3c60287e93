"""Does the simulator predict the real runtime? Fit a CPU "hardware" from the PP = 2 runtime's
stage times, then compare predicted and measured throughput workload by workload.

    python benchmarks/calibrate_sim.py [--model smollm2] [--concurrency 16] [--repeat 3] [--fit-on all]
    python benchmarks/calibrate_sim.py --workloads short-suffix --policies wavepp,lockstep \
        --concurrency 128 --num-requests 512 --repeat 1     # lockstep's loss, predicted
    python benchmarks/calibrate_sim.py --workloads short-suffix,reuse --policies wavepp,trtllm-pp,sglang-pp \
        --concurrency 8 --repeat 2                           # the outside loops, predicted

Each workload runs `--repeat` times on the real runtime (medians reported); the fit uses every
wave of the fitting workload's runs (`--fit-on reuse` holds the other workloads out). The
outside loops (trtllm-pp, sglang-pp) are simulated with their host cost per iteration as
measured in their own runs of that workload (`loop_costs_from_rounds`: the runtime's
per-iteration exchanges); their compute comes from wavepp's fit like every other policy's,
or, with `--fit-policies all`, from a fit over every policy's waves (the loops' waves hold
more, shorter chunks than wavepp's, which a fit on wavepp's alone extrapolates to).
"""

from __future__ import annotations

import argparse
import statistics

from wavepp.bench.measure import run_closed_loop as run_real
from wavepp.cli import comma_list
from wavepp.engine import Engine
from wavepp.models import load_model_config
from wavepp.sched.policy import get_policy
from wavepp.sim import CpuHardware, StageSample, loop_costs_from_rounds
from wavepp.sim.harness import run_closed_loop as run_sim
from wavepp.model_store import resolve_model
from wavepp.workloads import make_workload


def workloads(vocab: int, n: int):
    return {
        "reuse": make_workload("reuse", num_requests=n, num_groups=8, prompt_len=512, vocab_size=vocab),
        "short-suffix": make_workload("short_suffix", num_requests=n, num_groups=8, prefix_len=1024,
                                      suffix_len=64, vocab_size=vocab),
        "mixed": make_workload("mixed", num_requests=n, num_groups=8, prompt_len=512, vocab_size=vocab),
        "cold": make_workload("cold", num_requests=n // 2, prompt_len=512, vocab_size=vocab),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--fit-on", default="all", help="a workload name, or all (default)")
    ap.add_argument("--workloads", default="reuse,short-suffix,mixed,cold", help="comma list")
    ap.add_argument("--policies", default="wavepp",
                    help="comma list; the fit uses wavepp's samples only (see --fit-policies), the "
                         "other policies are predicted")
    ap.add_argument("--fit-policies", default="wavepp",
                    help="comma list of the policies whose stage samples the compute fit uses "
                         "(default wavepp; all: every policy run, so the fit sees every wave shape)")
    args = ap.parse_args()
    vocab = load_model_config(resolve_model(args.model)).vocab_size
    wanted = comma_list(args.workloads)
    policies = comma_list(args.policies)
    fit_policies = policies if args.fit_policies == "all" else comma_list(args.fit_policies)
    if not set(fit_policies) <= set(policies):
        raise SystemExit("--fit-policies must be among --policies (the fit uses their stage samples)")
    wls = {k: v for k, v in workloads(vocab, args.num_requests).items() if k in wanted}
    if args.fit_on != "all" and args.fit_on not in wls:
        raise SystemExit(f"--fit-on {args.fit_on}: not among --workloads")
    measured, samples, spans = {}, [], {}
    with Engine(args.model, pp=2) as engine:
        engine.prefill([next(iter(wls.values())).prompts[0][:128]])      # warm-up
        for rep in range(args.repeat):
            for name, wl in wls.items():
                order = policies if rep % 2 == 0 else policies[::-1]
                for policy in order:
                    engine.reset(policy)
                    m = run_real(engine, wl, args.concurrency, policy_label=policy, repeat=rep)
                    measured.setdefault((name, policy), []).append(m.input_tok_s)
                    spans.setdefault((name, policy), []).extend(engine.stats().round_spans)
                    if policy in fit_policies and args.fit_on in (name, "all"):
                        samples += [StageSample(s, shapes, sec) for s, shapes, sec in engine.stats().stage_samples]
    hardware = CpuHardware.fit(samples, num_stages=2)
    print(f"fitted on {args.fit_on} under {','.join(fit_policies)} ({len(samples)} stage samples): "
          f"{hardware.stage_costs}")
    print(f"{'workload':14} {'policy':10} {'runtime tok/s':>14} {'simulator':>10} {'ratio':>6}  loop host costs")
    for name, wl in wls.items():
        for policy in policies:
            loop_costs = note = None
            if get_policy(policy).loop is not None:
                loop_costs = loop_costs_from_rounds(spans[(name, policy)])
                note = f"schedule {1e3 * loop_costs.schedule_s:.2f} ms, hop {1e3 * loop_costs.hop_s:.2f} ms"
            sim = hardware.build(policy, stage_num_blocks=4096, block_size=16, loop_costs=loop_costs)
            predicted = run_sim(sim, wl.prompts, args.concurrency, policy).input_tok_s
            real = statistics.median(measured[(name, policy)])
            print(f"{name:14} {policy:10} {real:14,.0f} {predicted:10,.0f} {predicted / real:6.2f}  {note or ''}")


if __name__ == "__main__":
    main()
