"""`vllm bench serve` against `wavepp serve` and against `vllm serve`, the same model, dataset and
concurrencies, one server after the other, and both tables side by side.

    .venv/bin/python benchmarks/vllm_bench_serve.py --vllm-python .venv-vllm/bin/python \\
        [--model smollm2] [--pp 2] [--concurrency 8,32] [--num-prompts 256] \\
        [--prefix-len 512] [--suffix-len 64] [--num-prefixes 4] [--output-len 1] \\
        [--wavepp-args "--layer-split 14,16"]

The harness is vLLM's serving benchmark (the one most serving numbers are published with), run
from vLLM's own virtual environment (its CPU build; README "Against vLLM"): it streams every
request from /v1/completions and times the first chunk (TTFT). Its dataset is
prefix_repetition: `--num-prefixes` shared prefixes of `--prefix-len` tokens, each prompt one
of them plus its own `--suffix-len` tokens. Every request asks `--temperature 0` (greedy, what
a prefill engine answers; vLLM would sample otherwise).

Each server starts once and gets a warm-up run of 16 unrelated prompts; before each measured
run its prefix cache is emptied (wavepp: POST /debug/reset, started with --debug; vLLM: POST
/reset_prefix_cache, started with VLLM_SERVER_DEV_MODE=1), so every run starts cold and the
reuse is the dataset's own. vLLM serves in bf16 with prefix caching on, its engine threads on
`--bind` (VLLM_CPU_OMP_THREADS_BIND). Only the first token is asked (`--output-len 1`).

This script imports wavepp only to find the model's directory; the benchmark runs in vLLM's
Python, and the servers in their own processes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from wavepp.runtime.launch import free_port

BENCH = ("import sys\n"
         "from vllm.benchmarks.serve import add_cli_args, main\n"
         "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
         "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))\n")
ROWS = (("completed", "successful requests", "{:.0f}"), ("failed", "failed requests", "{:.0f}"),
        ("p50_ttft_ms", "TTFT p50 (ms)", "{:,.0f}"), ("p99_ttft_ms", "TTFT p99 (ms)", "{:,.0f}"),
        ("mean_ttft_ms", "TTFT mean (ms)", "{:,.0f}"), ("request_throughput", "requests/s", "{:.2f}"),
        ("input_tok_s", "input tok/s", "{:,.0f}"), ("duration", "seconds", "{:.1f}"))


def main() -> None:
    args = _parse_args()
    from wavepp.model_store import resolve_model

    model_dir = str(resolve_model(args.model))
    runs = {}
    for system in args.systems:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = _start(system, args, model_dir, port)
        try:
            _wait_healthy(url, proc, args.start_timeout_s)
            _bench(args, model_dir, url, num_prompts=16, concurrency=4, seed=1000, out=None)   # warm-up
            for c in args.concurrency:
                _reset(system, url)
                runs[(system, c)] = _bench(args, model_dir, url, args.num_prompts, c, args.seed,
                                           out=Path(args.result_dir) / f"{system}-c{c}.json")
                print(f"{system} c={c}: {_summary(runs[(system, c)])}", flush=True)
                if system == "wavepp":
                    _tail(url, Path(args.result_dir) / f"{system}-c{c}")
        finally:
            _stop(proc)
    _print_table(args, runs)


# ---- the servers -----------------------------------------------------------------------------

def _start(system: str, args, model_dir: str, port: int) -> subprocess.Popen:
    log = open(Path(args.result_dir) / f"{system}-server.log", "w")
    if system == "wavepp":
        cmd = [sys.executable, "-m", "wavepp.cli", "serve", "--model", args.model, "--pp", str(args.pp),
               "--port", str(port), "--debug", "--served-model-name", args.served_name,
               "--scheduling-policy", args.scheduling_policy, *args.wavepp_args.split()]
        env = os.environ
    else:
        cmd = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
               "--served-model-name", args.served_name, "--port", str(port), "--dtype", args.vllm_dtype,
               "--max-model-len", "2048", "--enable-prefix-caching"]
        env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", VLLM_CPU_OMP_THREADS_BIND=args.bind,
                   VLLM_CPU_NUM_OF_RESERVED_CPU="0", VLLM_CPU_KVCACHE_SPACE=str(args.vllm_kv_gib))
    print(f"starting {system}: {' '.join(cmd)}", flush=True)
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it was healthy (see its log)")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{url}/health did not answer within {timeout_s:.0f} s")


def _tail(url: str, stem: Path) -> None:
    """wavepp's own view of the run just measured: each request's phases (GET /debug/requests),
    the median and p99 requests' breakdown, and a Perfetto trace of those two beside the stages'
    waves and the admission rounds (stem.requests.json, stem.trace.json)."""
    from wavepp.bench.tail import at_quantile, breakdown, markdown, trace_events

    def get(path: str) -> dict:
        with urllib.request.urlopen(f"{url}{path}", timeout=120) as r:
            return json.loads(r.read())

    records = get("/debug/requests")["requests"]
    stats = get("/debug/stage_samples")
    stem.with_suffix(".requests.json").write_text(json.dumps(records))
    chosen = [("median request", at_quantile(records, 0.5)), ("p99 request", at_quantile(records, 0.99))]
    events = trace_events(chosen, stats["wave_spans"], stats["round_spans"])
    stem.with_suffix(".trace.json").write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    print(f"wavepp's own view (server side; trace: {stem.with_suffix('.trace.json')}):")
    print(markdown(breakdown(records)), flush=True)


def _reset(system: str, url: str) -> None:
    path = "/debug/reset" if system == "wavepp" else "/reset_prefix_cache"
    req = urllib.request.Request(f"{url}{path}", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.status == 200, r.status


# ---- the harness -----------------------------------------------------------------------------

def bench_command(args, model_dir: str, url: str, num_prompts: int, concurrency: int, seed: int) -> list[str]:
    """`vllm bench serve`'s arguments (run as a module: the CPU build's `vllm` command looks for a
    package named vllm)."""
    return [args.vllm_python, "-c", BENCH, "--backend", "openai", "--base-url", url,
            "--endpoint", "/v1/completions", "--model", model_dir, "--served-model-name", args.served_name,
            "--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", str(args.prefix_len),
            "--prefix-repetition-suffix-len", str(args.suffix_len),
            "--prefix-repetition-num-prefixes", str(args.num_prefixes),
            "--prefix-repetition-output-len", str(args.output_len), "--num-prompts", str(num_prompts),
            "--max-concurrency", str(concurrency), "--temperature", "0", "--seed", str(seed),
            "--percentile-metrics", "ttft,e2el", "--metric-percentiles", "50,99", "--disable-tqdm"]


def _bench(args, model_dir: str, url: str, num_prompts: int, concurrency: int, seed: int, out: Path | None) -> dict:
    cmd = bench_command(args, model_dir, url, num_prompts, concurrency, seed)
    with tempfile.TemporaryDirectory() as tmp:
        result_file = Path(tmp) / "result.json"
        full = cmd + ["--save-result", "--save-detailed", "--result-dir", tmp, "--result-filename", result_file.name]
        proc = subprocess.run(full, capture_output=True, text=True)
        if proc.returncode or not result_file.exists():
            raise RuntimeError(f"vllm bench serve failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                               f"{proc.stderr[-3000:]}")
        result = json.loads(result_file.read_text())
    ttfts = sorted(t * 1000 for t, e in zip(result["ttfts"], result["errors"]) if not e)
    result["p50_ttft_ms"] = result.get("p50_ttft_ms", _quantile(ttfts, 0.5))
    result["p99_ttft_ms"] = result.get("p99_ttft_ms", _quantile(ttfts, 0.99))
    result["input_tok_s"] = result["total_input_tokens"] / result["duration"]
    result["command"] = " ".join(a if a != BENCH else "'<vllm bench serve>'" for a in cmd)
    if out is not None:
        # per request: its start and TTFT (which requests are the slow ones); not the texts
        keep = {k: v for k, v in result.items() if k not in ("itls", "generated_texts", "input_lens",
                                                             "output_lens", "queue_times", "latencies")}
        keep["first_errors"] = [e for e in result["errors"] if e][:5]
        del keep["errors"]
        out.write_text(json.dumps(keep, indent=1))
    return result


# ---- the report ------------------------------------------------------------------------------

def _print_table(args, runs: dict) -> None:
    systems = sorted(args.systems, key=lambda s: -sum(runs[(s, c)]["request_throughput"] for c in args.concurrency))
    print(f"\nmachine: {_cpu_name()}; {os.cpu_count()} CPUs; model {args.model}; prefix_repetition "
          f"{args.num_prefixes} x {args.prefix_len} + {args.suffix_len}, {args.num_prompts} prompts, "
          f"output {args.output_len}; wavepp --pp {args.pp}; vLLM {args.vllm_dtype}, bind {args.bind}")
    cols = [(s, c) for c in args.concurrency for s in systems]
    head = f"{'':>22}" + "".join(f"{f'{s} c={c}':>16}" for s, c in cols)
    print(head)
    for key, name, fmt in ROWS:
        print(f"{name:>22}" + "".join(f"{fmt.format(runs[col][key]):>16}" for col in cols))
    for c in args.concurrency if len(systems) > 1 else ():
        a, b = runs[(systems[0], c)], runs[(systems[1], c)]
        print(f"c={c}: {systems[0]} / {systems[1]} requests/s {a['request_throughput'] / b['request_throughput']:.2f}x, "
              f"TTFT p50 {b['p50_ttft_ms'] / a['p50_ttft_ms']:.2f}x lower")
    print("\ncommands:")
    for (s, c), r in runs.items():
        print(f"  {s} c={c}: {r['command']}")


def _summary(r: dict) -> str:
    return (f"{r['completed']} ok, {r['failed']} failed, TTFT p50 {r['p50_ttft_ms']:,.0f} ms p99 "
            f"{r['p99_ttft_ms']:,.0f} ms, {r['request_throughput']:.2f} req/s, {r['input_tok_s']:,.0f} input tok/s")


def _quantile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    i = q * (len(xs) - 1)
    lo = int(i)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (i - lo)


def _cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def _parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm-python", required=True, help="the Python of a venv with vLLM's CPU build")
    p.add_argument("--systems", type=lambda s: s.split(","), default=["wavepp", "vllm"])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--served-name", default="smollm2", help="the model's name in both APIs")
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--scheduling-policy", default="fcfs", help="wavepp serve's (default fcfs)")
    p.add_argument("--wavepp-args", default="", help="more of wavepp serve's options, as one string")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[8, 32])
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--prefix-len", type=int, default=512)
    p.add_argument("--suffix-len", type=int, default=64)
    p.add_argument("--num-prefixes", type=int, default=4)
    p.add_argument("--output-len", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bind", default="0-1", help="VLLM_CPU_OMP_THREADS_BIND (default: both cores)")
    p.add_argument("--vllm-dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--vllm-kv-gib", type=int, default=4, help="VLLM_CPU_KVCACHE_SPACE (default 4)")
    p.add_argument("--start-timeout-s", type=float, default=900)
    p.add_argument("--result-dir", default="out/vllm-bench-serve",
                   help="per-run results (JSON) and the servers' logs (default out/vllm-bench-serve)")
    args = p.parse_args()
    Path(args.result_dir).mkdir(parents=True, exist_ok=True)
    return args


if __name__ == "__main__":
    main()
