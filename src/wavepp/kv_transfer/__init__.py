"""KV hand-off to a decode engine, by concern. What both transports share sits here: rank 0's
`KVHandoff` (handoff.py) with its stage reports (reports.py), each stage's export out of the
paged pools (export.py), the decode side's plan (decode_plan.py), the usage record (usage.py),
the declared interfaces a transport implements (interfaces.py) and the one registry of
transports (transports.py). Each transport is a subpackage with its stage side, its rank-0 side
and its decode side: `directory/` (a store on a file system) and `mooncake/` (each stage's arena,
read over Mooncake's transfer engine)."""

from wavepp.kv_transfer.handoff import KVHandoff
from wavepp.kv_transfer.transports import TRANSPORTS, Transport, get_transport
from wavepp.kv_transfer.usage import ArenaUsage, HandoffUsage

__all__ = ["TRANSPORTS", "ArenaUsage", "HandoffUsage", "KVHandoff", "Transport", "get_transport"]
