"""A bounded HTTP load generator for `wavepp serve` (loopback tests and benchmarks).

`run_load(url, prompts, concurrency, disconnect_fraction)`: `concurrency` clients take the
prompts in order, each sends /v1/completions and waits; a chosen fraction of the requests
disconnect at a random moment (the client cancels: its connection closes mid-request). It
stops by itself once every prompt was sent (or, with `stop_on_error`, after the first error:
the clients take no new prompt), and returns what happened (a LoadReport). `wavepp bench --url`
drives its closed loop with it.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class LoadReport:
    num_ok: int = 0
    num_disconnected: int = 0
    num_rejected: int = 0  # 429
    num_errors: int = 0  # any other status, or a transport error
    num_resent: int = 0  # sent again once after the connection closed under it
    errors: list[str] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)  # of the ok ones, in send order
    cached_tokens: int = 0
    prompt_tokens: int = 0
    wall_s: float = 0.0


async def _load(
    url: str,
    prompts,
    concurrency: int,
    disconnect_fraction: float,
    seed: int,
    max_disconnect_s: float,
    timeout_s: float,
    model: str | None,
    stop_on_error: bool,
    on_done,
) -> LoadReport:
    rng = random.Random(seed)
    plan = [
        (p, rng.random() < disconnect_fraction, rng.uniform(0.0, max_disconnect_s)) for p in prompts
    ]
    report = LoadReport()
    next_index = iter(range(len(plan)))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def send(client: httpx.AsyncClient, i: int) -> None:
        prompt, disconnect, after_s = plan[i]
        body = {"prompt": prompt, "max_tokens": 1}
        if model is not None:
            body["model"] = model
        t0 = time.perf_counter()

        async def post():
            # a pooled keep-alive connection the server closed as the request went out fails
            # with no response: send it once more on a fresh connection (a prefill is
            # idempotent), and count it
            try:
                return await client.post("/v1/completions", json=body)
            except (httpx.RemoteProtocolError, httpx.ReadError):
                report.num_resent += 1
                return await client.post("/v1/completions", json=body)

        try:
            if disconnect:
                await asyncio.wait_for(post(), after_s)
                report.num_ok += 1  # it finished before the client gave up
                return
            r = await post()
        except asyncio.TimeoutError:
            report.num_disconnected += 1
            return
        except httpx.HTTPError as exc:
            report.num_errors += 1
            report.errors.append(f"{type(exc).__name__}: {exc}")
            return
        if r.status_code == 200:
            report.num_ok += 1
            report.latencies_s.append(time.perf_counter() - t0)
            usage = r.json()["usage"]
            report.prompt_tokens += usage["prompt_tokens"]
            report.cached_tokens += usage["prompt_tokens_details"]["cached_tokens"]
        elif r.status_code == 429:
            report.num_rejected += 1
        else:
            report.num_errors += 1
            report.errors.append(f"{r.status_code}: {r.text[:200]}")

    async def client_loop(client: httpx.AsyncClient) -> None:
        for i in next_index:
            if stop_on_error and (report.num_errors or report.num_rejected):
                return
            await send(client, i)
            if on_done is not None:
                on_done(1)

    t0 = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
    report.wall_s = time.perf_counter() - t0
    return report


def run_load(
    url: str,
    prompts,
    *,
    concurrency: int = 64,
    disconnect_fraction: float = 0.0,
    seed: int = 0,
    max_disconnect_s: float = 0.05,
    timeout_s: float = 120.0,
    model: str | None = None,
    stop_on_error: bool = False,
    on_done=None,
) -> LoadReport:
    """Send every prompt once from `concurrency` clients; see the module docstring.
    `model`: the request's "model" field (None: left out); `on_done(1)` is called after each
    request ends, whatever its outcome."""
    return asyncio.run(
        _load(
            url,
            list(prompts),
            concurrency,
            disconnect_fraction,
            seed,
            max_disconnect_s,
            timeout_s,
            model,
            stop_on_error,
            on_done,
        )
    )


def group_prompts(
    num: int,
    *,
    vocab_size: int,
    num_groups: int = 8,
    prefix_len: int = 48,
    suffix_len: tuple[int, int] = (4, 24),
    seed: int = 0,
) -> list[list[int]]:
    """`num` token-id prompts: a shared prefix of one of `num_groups` groups + a random suffix."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(vocab_size) for _ in range(prefix_len)] for _ in range(num_groups)]
    return [
        rng.choice(prefixes) + [rng.randrange(vocab_size) for _ in range(rng.randint(*suffix_len))]
        for _ in range(num)
    ]
