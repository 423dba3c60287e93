"""AllStageBlocks with tiny numbers (two stages, block size 4): the exact events of the blocks
held on every stage, parents before children, a chain announced again once it is whole, the
tokens kept while they may be needed, the medium following a block into a host tier and back;
and the same driven by two real pools, with and without host tiers (hypothesis)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.cache.test_cache_pool_basics import run_request
from tests.cache.test_cache_snapshots import B as SB
from tests.cache.test_cache_snapshots import serve
from wavepp.cache import BlockChanges, BlockLog, BlockPool, HostTier, SnapshotPool, hash_blocks
from wavepp.cache.block_log import HOST_REMOVED, HOST_STORED, REMOVED, STORED, attach_block_log
from wavepp.kv_events import AllCleared, AllStageBlocks, RemovedBlock, StoredBlock
from wavepp.kv_events.all_stage_blocks import CPU, GPU

B = 4
PROMPT = list(range(3 * B))
H = hash_blocks(PROMPT, B)  # three blocks: H[0] <- H[1] <- H[2]
TOKENS = [tuple(PROMPT[i * B : (i + 1) * B]) for i in range(3)]


def stored(*indices: int) -> BlockChanges:
    return BlockChanges(tuple((STORED, H[i], H[i - 1] if i else None) for i in indices))


def removed(*indices: int) -> BlockChanges:
    return BlockChanges(tuple((REMOVED, H[i], None) for i in indices))


def host_stored(*indices: int) -> BlockChanges:
    return BlockChanges(tuple((HOST_STORED, H[i], H[i - 1] if i else None) for i in indices))


def host_removed(*indices: int) -> BlockChanges:
    return BlockChanges(tuple((HOST_REMOVED, H[i], None) for i in indices))


def announced(i: int, medium: str = GPU) -> StoredBlock:
    return StoredBlock(H[i], H[i - 1] if i else None, TOKENS[i], medium)


def test_a_block_in_a_host_tier_is_announced_as_cpu_and_moves_back_to_gpu_when_loaded():
    blocks = AllStageBlocks(2, B)
    blocks.note_prompt(H, PROMPT)
    blocks.apply([(0, stored(0, 1, 2)), (1, stored(0, 1, 2))], blocks.mark())
    assert blocks.take_events() == [announced(0), announced(1), announced(2)]
    # stage 1 evicts the chain's tail into its host tier (stored there before the pool lets go)
    evict = BlockChanges(((HOST_STORED, H[2], H[1]), (REMOVED, H[2], None)))
    blocks.apply([(1, evict)], blocks.mark())
    assert blocks.take_events() == [RemovedBlock(H[2], GPU), announced(2, CPU)]
    evict = BlockChanges(((HOST_STORED, H[1], H[0]), (REMOVED, H[1], None)))
    blocks.apply([(1, evict)], blocks.mark())  # its parent too: the child stays announced
    assert blocks.take_events() == [RemovedBlock(H[1], GPU), announced(1, CPU)]
    assert [blocks.medium(h) for h in H] == [GPU, CPU, CPU]
    blocks.check_integrity()
    # a load puts H[1] back in stage 1's pool (the host tier keeps its copy): GPU again
    blocks.apply([(1, stored(1))], blocks.mark())
    assert blocks.take_events() == [RemovedBlock(H[1], CPU), announced(1, GPU)]
    # the host tier lets H[1] go (the pool still has it: nothing changes), then H[2]
    blocks.apply([(1, host_removed(1))], blocks.mark())
    assert blocks.take_events() == []
    blocks.apply([(1, host_removed(2))], blocks.mark())
    assert blocks.take_events() == [RemovedBlock(H[2], CPU)]
    assert blocks.announced == {H[0], H[1]}
    blocks.check_integrity()


def test_a_block_in_one_stages_pool_and_the_others_host_tier_only_is_announced_as_cpu():
    blocks = AllStageBlocks(2, B)
    blocks.note_prompt(H, PROMPT)
    blocks.apply([(0, stored(0, 1)), (1, host_stored(0, 1))], blocks.mark())
    assert blocks.take_events() == [announced(0, CPU), announced(1, CPU)]
    # stage 0's host tier lets the root go while its pool keeps it: nothing; stage 1's does:
    # the chain is withdrawn from the leaf up
    blocks.apply([(1, host_removed(0))], blocks.mark())
    assert blocks.take_events() == [RemovedBlock(H[1], CPU), RemovedBlock(H[0], CPU)]
    # a resync of stage 1 with the root in its pool: the chain is announced again
    resync = BlockChanges(resync=True, held=((STORED, H[0], None), (HOST_STORED, H[1], H[0])))
    blocks.apply([(1, resync)], 0)
    assert blocks.take_events() == [announced(0, GPU), announced(1, CPU)]
    assert blocks.restatement() == [AllCleared(), announced(0, GPU), announced(1, CPU)]
    blocks.check_integrity()


def test_a_block_is_announced_when_the_last_stage_holds_it_and_withdrawn_when_one_lets_go():
    blocks = AllStageBlocks(2, B)
    blocks.note_prompt(H, PROMPT)
    blocks.apply([(0, stored(0, 1, 2)), (1, stored(0, 1))], blocks.mark())
    assert blocks.take_events() == [announced(0), announced(1)]
    blocks.apply([(1, stored(2))], blocks.mark())
    assert blocks.take_events() == [announced(2)]
    blocks.apply([(1, removed(2, 1))], blocks.mark())  # stage 1 evicts, leaf first
    assert blocks.take_events() == [RemovedBlock(H[2]), RemovedBlock(H[1])]
    assert blocks.announced == {H[0]}
    blocks.check_integrity()


def test_a_child_held_everywhere_waits_for_its_parent_and_comes_back_with_it():
    blocks = AllStageBlocks(2, B)
    blocks.note_prompt(H, PROMPT)
    # stage 1 resyncs with a set that has the child and not the parent (its view is whole
    # only with both): nothing past the parent is announced
    blocks.apply([(0, stored(0, 1, 2))], blocks.mark())
    blocks.apply(
        [(1, BlockChanges(resync=True, held=((STORED, H[0], None), (STORED, H[2], H[1]))))], 0
    )
    assert blocks.take_events() == [announced(0)]
    blocks.apply([(1, stored(1))], blocks.mark())  # the parent: the child follows it
    assert blocks.take_events() == [announced(1), announced(2)]
    # the parent withdrawn alone (a resync without it): its announced child goes first
    blocks.apply(
        [(1, BlockChanges(resync=True, held=((STORED, H[0], None), (STORED, H[2], H[1]))))], 0
    )
    assert blocks.take_events() == [RemovedBlock(H[2]), RemovedBlock(H[1])]
    blocks.check_integrity()


def test_tokens_outlive_a_prompt_until_the_apply_after_its_end_and_while_stage_0_holds_them():
    blocks = AllStageBlocks(2, B, max_recent_blocks=0)
    blocks.note_prompt(H[:1], PROMPT)
    blocks.end_prompt(H[:1])  # it ended before its stage-0 change was drained
    blocks.apply([(0, stored(0))], blocks.mark())
    blocks.apply([(1, stored(0))], blocks.mark())  # stage 1's comes later: tokens still known
    assert blocks.take_events() == [announced(0)]
    blocks.apply([(1, removed(0))], blocks.mark())
    blocks.apply([(1, stored(0))], blocks.mark())  # recomputed on stage 1: announced again
    assert blocks.take_events() == [RemovedBlock(H[0]), announced(0)]
    blocks.apply([(1, removed(0)), (0, removed(0))], blocks.mark())
    assert blocks.state_size() == 0  # nothing held, no prompt: nothing kept


def test_a_chunk_published_after_its_request_ended_is_announced_from_the_recent_tokens():
    blocks = AllStageBlocks(2, B, max_recent_blocks=2)
    blocks.note_prompt(H, PROMPT)
    blocks.end_prompt(H)  # aborted: its chunk is still in flight
    blocks.apply([], blocks.mark())  # its tokens go to the recent ones
    blocks.apply([(0, stored(0, 1)), (1, stored(0, 1))], blocks.mark())
    assert blocks.take_events() == [announced(0), announced(1)]  # H[2]'s went: two are kept
    blocks.apply([(0, stored(2)), (1, stored(2))], blocks.mark())
    assert blocks.take_events() == [] and blocks.num_without_tokens == 1


def test_a_block_whose_tokens_are_unknown_waits_for_a_prompt_that_has_them():
    blocks = AllStageBlocks(2, B)
    blocks.apply([(0, stored(0)), (1, stored(0))], blocks.mark())
    assert blocks.take_events() == [] and blocks.num_without_tokens == 1
    blocks.note_prompt(H, PROMPT)
    assert blocks.take_events() == [announced(0)]


def test_clear_forgets_everything_and_says_so():
    blocks = AllStageBlocks(2, B)
    blocks.note_prompt(H, PROMPT)
    blocks.apply([(0, stored(0)), (1, stored(0))], blocks.mark())
    blocks.clear()
    assert blocks.take_events() == [announced(0), AllCleared()]
    assert blocks.announced == frozenset() and blocks.state_size() == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 5), st.integers(1, 4)), max_size=30))
def test_the_announced_blocks_are_the_prefixes_both_real_pools_hold(steps):
    """Two pools of different sizes run prompts of six shared stems; after every step the
    announced set (applied from the events) equals the blocks both pools hold computed."""
    pools = [BlockPool(12, B), BlockPool(7, B)]
    for pool in pools:
        pool.block_log = BlockLog(8, pool.computed_blocks)  # small: resyncs happen too
    blocks, seen = AllStageBlocks(2, B), {}
    for n, (first, stem, num_blocks) in enumerate(steps):
        prompt = [stem * 100 + t for t in range(num_blocks * B)] + [1]
        run_on_both(blocks, pools, run_request, n, prompt, first, seen)
        both = {h for h, _ in pools[0].computed_blocks()} & {
            h for h, _ in pools[1].computed_blocks()
        }
        assert set(seen) == both == blocks.announced
        blocks.check_integrity()


def reusable(pool: BlockPool, host: HostTier) -> dict[int, int | None]:
    """A stage's blocks in its pool or host tier: hash -> parent."""
    return dict(pool.computed_blocks()) | dict(host.held_blocks())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 5), st.integers(1, 4)), max_size=30))
def test_with_host_tiers_the_announced_blocks_and_media_are_what_each_stage_can_reuse(steps):
    """As above with a host tier under each pool: the announced set is the chains every stage
    holds in its pool or host tier (each block's parent announced), each block's medium GPU
    exactly when both pools hold it."""
    pools = [BlockPool(12, B), BlockPool(7, B)]
    hosts = [HostTier(6, 1), HostTier(9, 1)]
    for pool, host in zip(pools, hosts):
        pool.host_tier = host
        attach_block_log(pool, 8)
    blocks, seen = AllStageBlocks(2, B), {}
    for n, (first, stem, num_blocks) in enumerate(steps):
        prompt = [stem * 100 + t for t in range(num_blocks * B)] + [1]
        run_on_both(blocks, pools, run_request, n, prompt, first, seen)
        held = [reusable(pool, host) for pool, host in zip(pools, hosts)]
        both = {h: p for h, p in held[0].items() if h in held[1]}
        whole: set[int] = set()  # held by both, with every ancestor
        for h in sorted(both, key=lambda h: len(list(chain_of(h, both)))):
            if both[h] is None or both[h] in whole:
                whole.add(h)
        in_pools = {h for h, _ in pools[0].computed_blocks()} & {
            h for h, _ in pools[1].computed_blocks()
        }
        assert set(seen) == whole == blocks.announced
        assert all((medium == GPU) == (h in in_pools) for h, medium in seen.items())
        blocks.check_integrity()
        for host in hosts:
            host.check_integrity()


def run_on_both(blocks, pools, run, request_id, prompt, first, seen: dict) -> None:
    """One prompt run on both pools (`first`'s first) with `run`, their changes applied, and
    the events applied to `seen` (hash -> medium): a parent always before its child, a block
    removed under the medium it was announced with."""
    hashes = hash_blocks(prompt, blocks.block_size)
    blocks.note_prompt(hashes, prompt)
    for stage in (first, 1 - first):
        run(pools[stage], request_id, prompt)
    blocks.end_prompt(hashes)
    blocks.apply([(s, pools[s].block_log.drain()) for s in (0, 1)], blocks.mark())
    for event in blocks.take_events():
        if isinstance(event, StoredBlock):
            assert event.parent_hash is None or event.parent_hash in seen
            seen[event.block_hash] = event.medium
        else:
            assert seen.pop(event.block_hash) == event.medium


def chain_of(block_hash, parents):
    """A block's ancestors present in `parents` (itself first)."""
    while block_hash in parents:
        yield block_hash
        block_hash = parents[block_hash]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 1), st.integers(0, 4), st.integers(1, 9)), max_size=25),
    st.booleans(),
)
def test_hybrid_blocks_are_announced_only_on_the_way_to_a_snapshot_every_stage_holds(steps, host):
    """Two hybrid pools (snapshots every 2 blocks, few slots: snapshots are evicted alone too),
    with or without host tiers: the announced blocks are those held on every stage on a path,
    held on every stage, from the root to a block whose snapshot every stage holds; and a
    prompt's announced chain reaches at least the boundary a request of it would resume at, and
    no further than the blocks every stage holds."""
    b = SB
    pools = [
        SnapshotPool(24, b, num_slots=7, interval_blocks=2),
        SnapshotPool(14, b, num_slots=9, interval_blocks=2),
    ]
    hosts = [HostTier(8, 1, 1), HostTier(5, 1, 1)] if host else [None, None]
    for pool, tier in zip(pools, hosts):
        pool.host_tier = tier
        attach_block_log(pool, 8)
    blocks, seen = AllStageBlocks(2, b, hybrid=True), {}
    prompts = []
    for n, (first, stem, num_blocks) in enumerate(steps):
        prompt = [stem * 100 + t for t in range(num_blocks * b)] + [1]
        prompts.append(prompt)
        run_on_both(blocks, pools, serve, n, prompt, first, seen)
        held = [
            dict(pool.computed_blocks()) | (dict(tier.held_blocks()) if tier is not None else {})
            for pool, tier in zip(pools, hosts)
        ]
        snaps = [
            {h for h, _ in pool.computed_snapshots()}
            | ({h for h, _ in tier.held_snapshots()} if tier is not None else set())
            for pool, tier in zip(pools, hosts)
        ]
        both = {h: p for h, p in held[0].items() if h in held[1]}
        whole = {h for h in both if all(a in both for a in chain_of(h, both))}
        whole = {h for h in whole if set(chain_of(h, both)) <= whole and root_of(h, both)}
        anchors = {h for h in whole if h in snaps[0] and h in snaps[1]}
        want = {a for anchor in anchors for a in chain_of(anchor, both)}
        assert set(seen) == want == blocks.announced
        blocks.check_integrity()
        for prompt in prompts:  # a router's count: the resume point <= it <= the blocks held
            hashes = hash_blocks(prompt, b)
            counted, held_all = run_in(hashes, seen), run_in(hashes, whole)
            resume = max([k for k in range(1, held_all + 1) if hashes[k - 1] in anchors], default=0)
            assert resume <= counted <= held_all


def run_in(hashes, present) -> int:
    """How many of `hashes`, from the first, are in `present`."""
    n = 0
    while n < len(hashes) and hashes[n] in present:
        n += 1
    return n


def root_of(block_hash, parents) -> bool:
    """Whether a block's ancestors in `parents` reach a root (parent None)."""
    *_, top = chain_of(block_hash, parents)
    return parents[top] is None
