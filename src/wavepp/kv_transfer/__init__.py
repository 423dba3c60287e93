"""KV hand-off to a decode engine, by concern. What both transports share sits here: rank 0's
`KVHandoff` (handoff.py) with its stage reports (reports.py), each stage's export out of the
paged pools (export.py), the decode side's plan (decode_plan.py), the usage record (usage.py),
the declared interfaces a transport implements (interfaces.py) and the one registry of
transports (transports.py). Each transport is a subpackage with its stage side, its rank-0 side
and its decode side: `directory/` (a store on a file system) and `mooncake/` (each stage's arena,
read over Mooncake's transfer engine).

The package itself imports only the standard library (the registry, the usage record), so the
decode side loads in vLLM's environment; `KVHandoff` is imported from handoff.py."""

from wavepp.kv_transfer.transports import TRANSPORTS, Transport, get_transport
from wavepp.kv_transfer.usage import ArenaUsage, HandoffUsage

__all__ = ["TRANSPORTS", "ArenaUsage", "HandoffUsage", "Transport", "get_transport"]
