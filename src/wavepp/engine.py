"""The Engine: wavepp's Python API (rank 0).

engine = Engine("smollm2", pp=2, policy="wavepp")
results = engine.prefill(["The capital of France is", [1, 2, 3, 4]])
results[0].first_token_id, results[0].first_token_logprob, results[0].num_cached_tokens
fut = engine.submit(prompt); fut.result()      # asynchronous
engine.abort(request_id); engine.shutdown()    # or use it as a context manager
"""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import Future
from typing import Sequence

from wavepp.engine_config import EngineConfig
from wavepp.kv_transfer.handoff import KVHandoff
from wavepp.kv_transfer.usage import HandoffUsage
from wavepp.model_store import DEFAULT_MODEL, resolve_model
from wavepp.models import load_model_config, page_layout
from wavepp.prefill_answers import PrefillAnswers
from wavepp.prefill_result import PrefillResult, with_transfer_error
from wavepp.prompts import Prompt, check_request_options, prompt_token_ids
from wavepp.runtime.config import RuntimeConfig
from wavepp.runtime.core import EngineCore, EngineError
from wavepp.runtime.core_stats import CoreStats, EngineLoad
from wavepp.runtime.device import check_backend, default_backend, resolve_device
from wavepp.runtime.launch import LocalCluster, pinned_cpu_sets
from wavepp.runtime.protocol import IntegrityReport
from wavepp.runtime.stage_blocks import stage_blocks
from wavepp.runtime.stage_split import choose_stage_split
from wavepp.tokenizer import Tokenizer

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, model: str | EngineConfig = DEFAULT_MODEL, **options):
        """Start a pipeline of `pp` stage processes for `model` (a built-in name or an HF-format
        directory), with `options` as EngineConfig names and documents them; or `Engine(config)`
        with an EngineConfig. Everything is validated before a process is spawned; a start that
        fails leaves no stage process, no process group and no run directory behind.
        `stage_split` is the layer split it runs (runtime/stage_split.py: each stage's layers,
        how they were chosen, each stage's predicted share of the work)."""
        self._closed = True
        if isinstance(model, EngineConfig):
            if options:
                raise TypeError(f"Engine(config) takes no other options, got {sorted(options)}")
            opts = model
        else:
            opts = EngineConfig(model, **options)
        self.config = opts  # the options, as given; every rank gets them in runtime_config
        pp = opts.pp
        device = resolve_device(opts.device)
        backend = default_backend(device, pp) if opts.backend is None else opts.backend
        check_backend(device, backend, pp)
        self.model_path = resolve_model(opts.model)
        self._tokenizer = Tokenizer(self.model_path)
        model_config = load_model_config(self.model_path)
        # the layers split into pp stages ("auto": measured here, before any stage process)
        self.stage_split = choose_stage_split(opts, model_config, str(self.model_path), device)
        log.info("%s", self.stage_split.describe())
        hybrid = page_layout(model_config).is_hybrid
        self._handoff = KVHandoff.for_engine(
            opts, hybrid=model_config.model_type if hybrid else None
        )
        publisher = None  # opened before any process: a taken port fails here
        if opts.publishes_kv_events:
            from wavepp.kv_events.publisher import EventPublisher  # zmq only where it is used

            publisher = EventPublisher.open(opts.kv_events, opts.block_size)
        try:
            self._cluster = LocalCluster(
                pp, backend, device, cpu_sets=pinned_cpu_sets(pp, device, opts.pin_cpus)
            )
        except BaseException:
            if publisher is not None:
                publisher.close()
            raise
        try:
            root = None if self._handoff is None else self._handoff.root
            kv_store = None if root is None else str(root)
            self.runtime_config = RuntimeConfig(
                opts,
                str(self.model_path),
                device,
                backend,
                self._cluster.run_dir,
                kv_store,
                self.stage_split.sizes,
                stage_blocks(opts, model_config, self.stage_split.sizes),
            )
            self._core = EngineCore(
                self.runtime_config,
                self._cluster.channels,
                self._cluster.dead_stage,
                self._handoff,
                publisher,
            )
        except BaseException:
            if publisher is not None:
                publisher.close()
            self._cluster.close(timeout_s=2)
            raise
        self._closed = False
        self._core.start(
            PrefillAnswers(
                self._core.unix_at, self._handoff, self._tokenizer, opts.pp, opts.block_size
            )
        )
        self._cluster.keep_stage_0_to(self._core.compute_thread_ids)
        if self._handoff is not None:
            self._handoff.start(self._core.answer_overdue, self._core.kv_writer)
        self._cluster.watch(self._core.fail)
        self.vocab_size = self._core.vocab_size

    # ---- requests ----------------------------------------------------------------------------

    def submit(
        self,
        prompt: Prompt,
        request_id: int | None = None,
        *,
        logprob_start: int | None = None,
        kv_transfer: bool | str = False,
        priority: int = 0,
    ) -> Future:
        """Queue one prompt (text or token ids); the future resolves to a PrefillResult, and
        its `request_id` attribute is the request's id.

        `request_id`: any int not in use by an unfinished request (None: an automatic one that
        is not in use). A bad prompt or an id in use raises ValueError and queues nothing; a
        prompt that no stage can hold, or longer than the model's positions, resolves at once
        to a failed result with the reason.

        `logprob_start`: also return the logprob of every prompt token after that position
        (`prompt_logprobs`); positions from there on are computed, never reused from the cache
        (reuse of the blocks before it stays).

        `kv_transfer`: hand the prompt's KV to a decode engine (needs `kv_store`): True for a
        fresh transfer id, or the id to use (see `check_transfer_id`); the result's
        `kv_transfer` says where the stages wrote it. The future resolves once every stage
        has written its part, or failed to: then `kv_transfer["error"]` names the stage and
        why (the first token is still the answer; the transfer is marked failed and will not
        load). A store that cannot take the transfer (a full disk) is such an error too: the
        prompt is prefilled without its hand-off.

        `priority`: lower is more urgent (vLLM's convention); an engine started with
        `scheduling_policy="priority"` admits and packs by it (sched/waiting.py), one started
        with "fcfs" takes only 0, as vLLM refuses a priority it does not schedule by."""
        token_ids = self.tokenize(prompt)
        check_request_options(
            len(token_ids), request_id, logprob_start, priority, self.config.scheduling_policy
        )
        export_id, refused = self._open_transfer(token_ids, kv_transfer)
        try:
            fut = self._core.submit(
                request_id,
                token_ids,
                logprob_start=logprob_start,
                export_id=export_id,
                priority=priority,
            )
        except BaseException:
            if export_id is not None:
                self._handoff.drop_own(export_id)
            raise
        return fut if refused is None else with_transfer_error(fut, refused)

    def prefill(self, prompts: Sequence[Prompt]) -> list[PrefillResult]:
        """Prefill every prompt; results in order. Every prompt is checked before any is
        queued (a bad one raises ValueError naming its index). A request that fails carries
        its error and the others go on; a dead pipeline raises EngineError."""
        token_lists = []
        for i, prompt in enumerate(prompts):
            try:
                token_lists.append(self.tokenize(prompt))
            except ValueError as exc:
                raise ValueError(f"prompt {i}: {exc}") from None
        futures = [self._core.submit(None, ids) for ids in token_lists]
        return [f.result() for f in futures]

    def _open_transfer(self, token_ids, kv_transfer) -> tuple[str | None, str | None]:
        """submit's hand-off: (the transfer id, None), (None, None) for no hand-off, or (None,
        why the store refused it). No hand-off configured is a ValueError."""
        if kv_transfer is False or kv_transfer is None:
            return None, None
        if self._handoff is None:
            raise ValueError(
                "kv_transfer needs the KV hand-off: start the engine with kv_store=DIR or "
                "kv_transport='mooncake'"
            )
        try:
            export_id = self._handoff.open(
                token_ids,
                kv_transfer,
                {
                    "model": str(self.model_path),
                    "num_stages": self.config.pp,
                    "block_size": self.config.block_size,
                    "dtype": self.config.dtype,
                },
            )
        except OSError as err:
            refused = f"the KV store could not take the transfer: {err.strerror or err}"
            log.warning("KV hand-off refused: %s", refused)
            return None, refused
        return export_id, None

    def abort(self, request_id: int) -> None:
        """Abort a request at any step; its future resolves to a result with error "aborted".
        An unknown or finished id is ignored."""
        self._core.abort(request_id)

    # ---- management --------------------------------------------------------------------------

    @property
    def policy(self) -> str:
        return self._core.policy.name

    @property
    def stage_num_blocks(self) -> tuple[int, ...]:
        return self._core.stage_num_blocks

    @property
    def stage_kernels(self) -> tuple[str, ...]:
        """Each stage's kernel paths, e.g. ("linear=packed attention=chunked_cpp", ...): measured
        at start-up on this machine (`WAVEPP_LINEAR_KERNEL` / `WAVEPP_ATTENTION_KERNEL` pin them)."""
        return self._core.stage_kernels()

    @property
    def stage_cpus(self) -> tuple[tuple[int, ...], ...] | None:
        """The CPUs each stage's process is pinned to, or None (not pinned: `pin_cpus`)."""
        sets = self._cluster.cpu_sets
        return None if sets is None else tuple(sets)

    @property
    def max_prompt_tokens(self) -> int:
        """The longest prompt every stage can hold and the model's positions allow."""
        return min(
            self._core.max_prompt_tokens, min(self.stage_num_blocks) * self.config.block_size
        )

    def load(self) -> EngineLoad:
        """Waiting and running counts, and the pipeline's fatal error (a dead stage) if any.
        Cheap: it reads the leader's queues under its lock."""
        load = self._core.load()
        if load.error is None and not self._closed:
            dead = self._cluster.dead_stage()
            if dead:
                load = dataclasses.replace(load, error=dead)
        return load

    def cached_prefix(self, prompts: Sequence[Prompt]) -> list:
        """For each prompt (text or ids), how much of it every stage holds now: CachedView
        (runtime/cache_queries.py). A bad prompt raises ValueError."""
        return self._core.cached_prefix([self.tokenize(p) for p in prompts])

    def stage_cache_counters(self) -> list:
        """Per stage, now: StageCacheCounters (runtime/cache_queries.py)."""
        return self._core.stage_cache_counters()

    def stage_capacity(self) -> list:
        """Each stage's blocks by state (CapacityView): stage 0's now, the others' as their last
        admission commit reported them (None before their first)."""
        return self._core.stage_capacity()

    def leader_state_size(self) -> int:
        """Entries of the leader's per-request structures: bounded by the requests outstanding,
        0 once every request ended (what a soak or an abort storm checks for leaks)."""
        return self._core.leader_state_size()

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer (any thread may call it: each encodes on a copy of its own)."""
        return self._tokenizer

    def decode(self, token_ids: Sequence[int]) -> str | None:
        """The text of token ids, or None when the model has no tokenizer."""
        try:
            return self._tokenizer.decode(token_ids)
        except ValueError:
            return None

    def reset(
        self,
        policy: str | None = None,
        *,
        snapshot_interval_blocks: int | None = None,
        snapshot_align_frac: float | None = None,
    ) -> None:
        """Wait for idle, empty every stage's cache, and switch policy if one is given. A hybrid
        model takes snapshots every `snapshot_interval_blocks` blocks from now on, on every
        stage, and its planner aligns chunk ends to that grid within `snapshot_align_frac`
        (None: keep either)."""
        self._core.reset(policy, snapshot_interval_blocks, snapshot_align_frac)

    @property
    def profile(self):
        """The start-up profiling pass (runtime.profile.WaveProfile), or None if it did not run."""
        return self._core.profile

    def kv_export_counts(self) -> tuple[int, int]:
        """KV parts the stages reported since the start: (written, failed), ended requests' too."""
        return (0, 0) if self._handoff is None else self._handoff.counts()

    def kv_events_counts(self) -> dict[str, int] | None:
        """The KV cache events published and dropped since start, the batches queued and the
        blocks announced now (None: the engine publishes none; kv_events/)."""
        return self._core.kv_events_counts()

    def kv_transfer_usage(self) -> HandoffUsage | None:
        """What the KV hand-off holds (kv_transfer/usage.py), read at its last sweep; or None."""
        return None if self._handoff is None else self._handoff.usage()

    def stats(self, rounds_since: int | None = None) -> CoreStats:
        """A consistent snapshot of per-stage time, rounds and waves since the last reset (with
        `rounds_since`: the totals and the later rounds' latencies only; CoreStats.snapshot)."""
        return self._core.stats(rounds_since)

    def check_integrity(self) -> list[IntegrityReport]:
        """After a workload drains: every stage's check_integrity(), then its capacity view."""
        return self._core.check_integrity()

    def shutdown(self) -> None:
        """Stop the pipeline. Requests still in flight fail with EngineError; later calls
        (submit, reset, check_integrity) raise EngineError. Safe to call twice. The order: the
        core (its threads, then the stages are told), the stage processes, the hand-off (its
        thread, then what this engine wrote in the store). A pipeline in error cannot tell its
        stages to stop: they are killed first, so that nothing waits for them to time out."""
        if self._closed:
            return
        self._closed = True
        self._cluster.unwatch()  # the stages exit on purpose from here on
        if self._handoff is not None:
            self._handoff.detach()  # before stage 0's transfer engine goes with the core
        if self._core.error:
            self._cluster.kill()
        try:
            self._core.shutdown()
        finally:
            self._cluster.close()
            if self._handoff is not None:
                self._handoff.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ---- internals ---------------------------------------------------------------------------

    def tokenize(self, prompt: Prompt, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a text or a sequence of ints, checked against the vocabulary
        (prompts.prompt_token_ids: anything else is refused with ValueError)."""
        return prompt_token_ids(prompt, self._tokenizer, self.vocab_size, add_special_tokens)

    def apply_chat_template(
        self,
        messages: Sequence[dict],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[int]:
        """The token ids of chat messages ({"role", "content"}) rendered by the model's chat
        template, with no special tokens added beyond the template's. ValueError when the
        model has no tokenizer or no template, or the template refuses the messages."""
        text = self._tokenizer.chat_text(
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
        )
        return self.tokenize(text, add_special_tokens=False)

    def token_strs(self, token_ids: Sequence[int]) -> list[str] | None:
        """Each token's string in the vocabulary (not decoded text); None without a tokenizer."""
        try:
            return self._tokenizer.token_strs(token_ids)
        except ValueError:
            return None

    def drop_transfer(self, transfer_id: str) -> bool:
        """Give up a KV transfer this engine wrote (the decode side failed): removed off this
        thread. False for an id that is unknown, another engine's, or with no store."""
        return self._handoff is not None and self._handoff.drop(transfer_id)


__all__ = ["Engine", "EngineConfig", "EngineError", "EngineLoad", "PrefillResult"]
