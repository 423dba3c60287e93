"""The Mooncake transport: every stage keeps its parts in an arena of its own, registered with a
Mooncake transfer engine of its own; the decode side pulls them straight from the stages'
memory, over TCP or RDMA.

    engine.py    TransferEngineHandle: Mooncake's transfer engine, as every side uses it
    ledger.py    ArenaLedger: which bytes of an arena hold which part, and its table (no torch)
    part.py      where a part lies, as the answer's params say it; the reads that pull it
    writer.py    the stage side (ArenaWriter: the arena, its copies, releases, header reads)
    backend.py   rank 0's side (ArenaBackend: each transfer's locations, releases, usage)
    puller.py    the decode side (ArenaPuller; decode_plan.py `plan_arena` decides first)

The decode side imports only engine.py, part.py and puller.py (with torch, numpy and mooncake):
it runs inside vLLM's environment.
"""
