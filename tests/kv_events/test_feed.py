"""KVEventsFeed: a batch the publisher dropped is made good by the next, which restates the
whole announced set (AllCleared, then parents first); decoded as a router applies them, the
stream leaves the subscriber with the set as it is."""

from tests.kv_events.test_all_stage_blocks import PROMPT, B, H, removed, stored
from wavepp.kv_events import AllCleared, RemovedBlock, StoredBlock
from wavepp.kv_events.feed import KVEventsFeed


class FlakyPublisher:
    """Refuses the batches whose numbers are in `refuse` (as a full queue would)."""

    def __init__(self, refuse: set[int]):
        self.refuse, self.sent, self.num_offered = refuse, [], 0

    def publish(self, events) -> bool:
        n, self.num_offered = self.num_offered, self.num_offered + 1
        if n in self.refuse:
            return False
        self.sent.append(events)
        return True

    def close(self) -> None:
        pass


def subscriber_view(batches) -> dict:
    held: dict = {}
    for events in batches:
        for event in events:
            if isinstance(event, StoredBlock):
                assert event.parent_hash is None or event.parent_hash in held
                held[event.block_hash] = event.parent_hash
            elif isinstance(event, RemovedBlock):
                del held[event.block_hash]
            else:
                assert isinstance(event, AllCleared)
                held.clear()
    return held


class Request:
    block_hashes, token_ids = H, PROMPT


def test_a_dropped_batch_is_made_good_by_a_restatement():
    publisher = FlakyPublisher(refuse={0})
    feed = KVEventsFeed(2, B, publisher)
    feed.note_prompt(Request())
    feed.apply([(0, stored(0, 1, 2)), (1, stored(0, 1, 2))], feed.mark())  # dropped
    assert publisher.sent == [] and feed.num_restatements == 0
    feed.apply([(1, removed(2))], feed.mark())  # the next batch restates
    assert publisher.sent == [
        [
            AllCleared(),
            StoredBlock(H[0], None, tuple(PROMPT[:B])),
            StoredBlock(H[1], H[0], tuple(PROMPT[B : 2 * B])),
        ]
    ]
    assert feed.num_restatements == 1
    feed.apply([(1, removed(1))], feed.mark())  # then deltas again
    assert publisher.sent[-1] == [RemovedBlock(H[1])]
    assert (
        subscriber_view(publisher.sent) == {H[0]: None} == {h: None for h in feed.blocks.announced}
    )
