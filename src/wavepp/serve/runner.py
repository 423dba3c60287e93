"""Between the event loop and the engine: every engine call off the loop, a request's prompts
submitted and awaited, and aborted when its client leaves.

The engine's methods take the leader's lock, which its LOOP thread holds while it plans a
wave; called on the event loop they would stall every connection for as long. So each call
(`load`, `submit`, `abort`, `stats`, ...) runs on a small thread pool of its own (`call`), and
the loop only awaits it. Work that takes long for a large request and no lock of the engine's
(tokenizing, detokenizing, parsing a large body, building and serializing an answer) runs on a
second pool (`work`), so a few large requests cannot take the threads the engine calls of every
other request need. Neither pool is the loop's default executor, so a long `/debug/integrity`
wait cannot starve requests of threads.

A prompt's life here:

    submit (pool)  ->  the engine's Future  ->  a loop future, settled by a callback
                                                 (its outcome counted in the metrics, once)
    the client leaves, or the handler is cancelled  ->  abort (pool, not awaited)

The loop futures are the server's own: cancelling one (a handler cancelled at shutdown) never
touches the engine's Future, whose result the engine still sets.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from starlette.requests import Request

from wavepp.engine import Engine, EngineError
from wavepp.openai_http import APIError
from wavepp.serve.metrics import ServeMetrics

ENGINE_THREADS = 8
WORK_THREADS = 8


@dataclass
class Submission:
    """A request's prompts in the engine: their ids and loop futures, in prompt order."""

    request_ids: list[int]
    futures: list[asyncio.Future]  # each resolves to a PrefillResult, or raises EngineError


class Runner:
    def __init__(self, engine: Engine, metrics: ServeMetrics, max_waiting: int, retry_after_s: int):
        self.engine = engine
        self.metrics = metrics
        self.max_waiting = max_waiting
        self.retry_after_s = retry_after_s
        prepare = engine.tokenizer.prepare  # each thread's tokenizer copy, made as it starts
        self.pool = ThreadPoolExecutor(
            ENGINE_THREADS, thread_name_prefix="wavepp-engine", initializer=prepare
        )
        self.work_pool = ThreadPoolExecutor(
            WORK_THREADS, thread_name_prefix="wavepp-work", initializer=prepare
        )

    def start_threads(self) -> None:
        """Start every thread of both pools now (blocking, at the server's start). A pool
        starts a thread when a call finds none idle, and the thread's tokenizer copy holds the
        GIL for about 0.1 s: at a burst of requests that held the leader's admission round and
        the event loop (the first round of 8 requests took 149-217 ms instead of 2)."""
        for pool, n in ((self.pool, ENGINE_THREADS), (self.work_pool, WORK_THREADS)):
            barrier = threading.Barrier(n)
            futures = [pool.submit(barrier.wait, 60) for _ in range(n)]
            for f in futures:
                f.result()

    async def call(self, fn, *args, **kwargs):
        """fn(*args, **kwargs) on the engine pool; the loop awaits it."""
        return await asyncio.get_running_loop().run_in_executor(
            self.pool, functools.partial(fn, *args, **kwargs)
        )

    async def work(self, fn, *args, **kwargs):
        """fn(*args, **kwargs) on the work pool (no engine lock; long for a large request)."""
        return await asyncio.get_running_loop().run_in_executor(
            self.work_pool, functools.partial(fn, *args, **kwargs)
        )

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.work_pool.shutdown(wait=False, cancel_futures=True)

    async def submit(
        self, token_lists, logprob_start, kv_transfer: bool = False, priority: int = 0
    ) -> Submission:
        """Check the pipeline is up (503) and has room (429), then queue every prompt, off the
        loop. logprob_start: one position (or None) per prompt; kv_transfer: every prompt's KV
        to the engine's store; priority: every prompt's (vLLM's: lower first). An option the
        engine refuses is a 400 and queues nothing. A handler cancelled while the submit runs
        aborts what the submit queued."""
        if priority != 0 and self.engine.config.scheduling_policy != "priority":
            raise APIError(
                400,
                "priority scheduling is not enabled: start the server with "
                "--scheduling-policy priority",
                "priority",
            )
        loop = asyncio.get_running_loop()
        task = loop.run_in_executor(
            self.pool, self._submit_all, token_lists, logprob_start, kv_transfer, priority
        )
        try:
            return self._submission(loop, await asyncio.shield(task))
        except asyncio.CancelledError:

            def abort_when_queued(t: asyncio.Future) -> None:
                if not t.cancelled() and t.exception() is None:
                    self.abort(self._submission(loop, t.result()))

            task.add_done_callback(abort_when_queued)
            raise

    def abort(self, submission: Submission) -> None:
        """Abort the submission's prompts that have not ended, without waiting (an unknown or
        finished id is ignored by the engine)."""
        ids = [i for i, f in zip(submission.request_ids, submission.futures) if not f.done()]
        if ids:
            self._abort_ids(ids)

    async def results(self, request: Request, submission: Submission) -> list | None:
        """Every prompt's PrefillResult, in order; None if the client left first (then every
        prompt is aborted). A failed prompt raises APIError: 503 for a pipeline that went down
        or an abort, 500 for a failure in the engine."""
        waiting = asyncio.gather(*submission.futures, return_exceptions=True)
        try:
            if not await first_or_disconnect(request, waiting):
                self.abort(submission)
                return None
        except asyncio.CancelledError:  # the server stops: abort, then let the cancel go on
            self.abort(submission)
            raise
        results = waiting.result()
        for r in results:
            raise_if_failed(r)
        return results

    # ---- internals ---------------------------------------------------------------------------

    def _submit_all(
        self, token_lists, logprob_start, kv_transfer: bool, priority: int
    ) -> list[Future]:
        """On the pool: the admission checks, then every prompt queued (all or none)."""
        load = self.engine.load()
        if load.error:
            self.metrics.count("unavailable", len(token_lists))
            raise APIError(503, f"the pipeline is down: {load.error}", type_="service_unavailable")
        if load.num_waiting + len(token_lists) > self.max_waiting:
            self.metrics.count("rejected", len(token_lists))
            raise APIError(
                429,
                f"too many requests waiting ({load.num_waiting} queued, at most "
                f"{self.max_waiting}); retry later",
                type_="rate_limit_error",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        futures = []
        try:
            for ids, start in zip(token_lists, logprob_start):
                futures.append(
                    self.engine.submit(
                        ids, logprob_start=start, kv_transfer=kv_transfer, priority=priority
                    )
                )
        except (EngineError, ValueError) as exc:
            for f in futures:
                self.engine.abort(f.request_id)
            if isinstance(exc, ValueError):
                self.metrics.count("bad_request", len(token_lists) - len(futures))
                raise APIError(
                    400, str(exc), "kv_transfer_params" if kv_transfer else None
                ) from None
            self.metrics.count("unavailable", len(token_lists) - len(futures))
            raise APIError(
                503, f"the pipeline is down: {exc}", type_="service_unavailable"
            ) from None
        return futures

    def _submission(
        self, loop: asyncio.AbstractEventLoop, engine_futures: list[Future]
    ) -> Submission:
        return Submission(
            [f.request_id for f in engine_futures], [self._on_loop(loop, f) for f in engine_futures]
        )

    def _abort_ids(self, request_ids: list[int]) -> None:
        def abort_all():
            for i in request_ids:
                self.engine.abort(i)

        try:
            self.pool.submit(abort_all)
        except RuntimeError:  # the pool is shut down: so is the engine
            pass

    def _on_loop(self, loop: asyncio.AbstractEventLoop, engine_future: Future) -> asyncio.Future:
        """A loop future that takes the engine future's outcome; the outcome is counted in the
        metrics when it arrives, whoever awaits it."""
        out = loop.create_future()

        def settle(f: Future) -> None:
            exc = f.exception()
            if exc is not None:
                self.metrics.count("unavailable")
            else:
                self.metrics.observe(f.result())
            if not out.done():
                if exc is not None:
                    out.set_exception(exc)
                    out.exception()  # retrieved: whoever awaits it still gets it, and a
                    # future nobody awaits (its client left) logs nothing
                else:
                    out.set_result(f.result())

        def done(f: Future) -> None:
            try:
                loop.call_soon_threadsafe(settle, f)
            except RuntimeError:  # the loop is closed: nobody awaits it
                pass

        engine_future.add_done_callback(done)
        return out


def raise_if_failed(result) -> None:
    """APIError for a prompt that did not finish: 503 for a pipeline down (EngineError) or an
    abort, 500 for a failure in the engine."""
    if isinstance(result, BaseException):
        raise APIError(503, f"the pipeline is down: {result}", type_="service_unavailable")
    if not result.ok:
        raise APIError(
            500 if result.error != "aborted" else 503,
            f"the request failed: {result.error}",
            type_="server_error",
        )


async def first_or_disconnect(request: Request, waiting: asyncio.Future) -> bool:
    """Wait for `waiting`; False if the client closed the connection first."""
    gone = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    return waiting.done()


async def disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body is already read, so the next
    ASGI message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
