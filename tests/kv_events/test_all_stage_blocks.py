"""AllStageBlocks with tiny numbers (two stages, block size 4): the exact events of the blocks
held on every stage, parents before children, a chain announced again once it is whole, the
tokens kept while they may be needed; and the same driven by two real pools (hypothesis)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.cache.test_cache_pool_basics import run_request
from wavepp.cache import BlockChanges, BlockLog, BlockPool, hash_blocks
from wavepp.cache.block_log import REMOVED, STORED
from wavepp.kv_events import AllCleared, AllStageBlocks, RemovedBlock, StoredBlock

B = 4
PROMPT = list(range(3 * B))
H = hash_blocks(PROMPT, B)  # three blocks: H[0] <- H[1] <- H[2]
TOKENS = [tuple(PROMPT[i * B : (i + 1) * B]) for i in range(3)]


def stored(*indices: int) -> BlockChanges:
    return BlockChanges(tuple((STORED, H[i], H[i - 1] if i else None) for i in indices))


def removed(*indices: int) -> BlockChanges:
    return BlockChanges(tuple((REMOVED, H[i], None) for i in indices))


def announced(i: int) -> StoredBlock:
    return StoredBlock(H[i], H[i - 1] if i else None, TOKENS[i])


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
    blocks.apply([(1, BlockChanges(resync=True, held=((H[0], None), (H[2], H[1]))))], 0)
    assert blocks.take_events() == [announced(0)]
    blocks.apply([(1, stored(1))], blocks.mark())  # the parent: the child follows it
    assert blocks.take_events() == [announced(1), announced(2)]
    # the parent withdrawn alone (a resync without it): its announced child goes first
    blocks.apply([(1, BlockChanges(resync=True, held=((H[0], None), (H[2], H[1]))))], 0)
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
    blocks, seen = AllStageBlocks(2, B), set()
    for n, (first, stem, num_blocks) in enumerate(steps):
        prompt = [stem * 100 + t for t in range(num_blocks * B)] + [1]
        blocks.note_prompt(hash_blocks(prompt, B), prompt)
        for stage in (first, 1 - first):
            run_request(pools[stage], n, prompt)
        blocks.end_prompt(hash_blocks(prompt, B))
        blocks.apply([(s, pools[s].block_log.drain()) for s in (0, 1)], blocks.mark())
        for event in blocks.take_events():
            if isinstance(event, StoredBlock):
                assert event.parent_hash is None or event.parent_hash in seen
                seen.add(event.block_hash)
            else:
                seen.discard(event.block_hash)
        both = {h for h, _ in pools[0].computed_blocks()} & {
            h for h, _ in pools[1].computed_blocks()
        }
        assert seen == both == blocks.announced
        blocks.check_integrity()
