"""Where a served request's time to its first token went, and a trace of the slow ones.

From `GET /debug/requests` (serve/request_log.py: each request's arrival and, from there, its first
admission round, its admission on every stage, its first chunk sent and its first token; then
the answer's way back to the HTTP layer) a request's time splits into five phases:

    queue   arrival -> its first admission round         (waiting for admission)
    round   -> admitted on every stage                   (the rounds it took)
    wave    -> its first chunk sent in a wave            (admitted, waiting for a wave)
    waves   -> its first token                           (its chunks through the stages)
    answer  -> its result at the HTTP layer

`breakdown` gives the phases of the requests at a TTFT quantile; `trace_events` the Perfetto
(Chrome trace) tracks of chosen requests beside the stages' waves and the admission rounds
(`GET /debug/stage_samples`), on one clock.
"""

from __future__ import annotations

from collections.abc import Sequence

PHASES = ("queue", "round", "wave", "waves", "answer")


def phases(record: dict) -> dict[str, float]:
    """A request's five phases in seconds (a phase it never reached: 0)."""
    queue = record.get("queue_s") or 0.0
    admitted = record.get("admission_s") or queue
    dispatched = record.get("dispatch_s") or admitted
    ttft = record.get("ttft_s") or dispatched
    return {
        "queue": queue,
        "round": max(0.0, admitted - queue),
        "wave": max(0.0, dispatched - admitted),
        "waves": max(0.0, ttft - dispatched),
        "answer": record.get("answer_s") or 0.0,
    }


def at_quantile(records: Sequence[dict], q: float) -> dict:
    """The served request whose TTFT is at quantile `q` (nearest rank)."""
    served = sorted((r for r in records if r.get("ttft_s") is not None), key=lambda r: r["ttft_s"])
    if not served:
        raise ValueError("no served request")
    return served[min(len(served) - 1, max(0, round(q * len(served)) - 1))]


def breakdown(records: Sequence[dict], quantiles: Sequence[float] = (0.5, 0.99)) -> list[dict]:
    """For each quantile, the request there: its TTFT, its phases, its tokens and priority."""
    out = []
    for q in quantiles:
        r = at_quantile(records, q)
        out.append(
            {
                "quantile": q,
                "ttft_s": r["ttft_s"],
                **phases(r),
                "prompt_tokens": r.get("prompt_tokens"),
                "cached_tokens": r.get("cached_tokens"),
                "priority": r.get("priority", 0),
                "arrival_unix_s": r.get("arrival_unix_s"),
            }
        )
    return out


def markdown(rows: Sequence[dict]) -> str:
    """The breakdown as a table, milliseconds."""
    head = "| TTFT quantile | TTFT ms | " + " | ".join(f"{p} ms" for p in PHASES)
    lines = [head + " | prompt / cached |", "|---" * (len(PHASES) + 3) + "|"]
    for r in rows:
        cells = " | ".join(f"{1e3 * r[p]:,.0f}" for p in PHASES)
        lines.append(
            f"| p{100 * r['quantile']:g} | {1e3 * r['ttft_s']:,.0f} | {cells} | "
            f"{r['prompt_tokens']} / {r['cached_tokens']} |"
        )
    return "\n".join(lines)


def trace_events(
    chosen: Sequence[tuple[str, dict]],
    wave_spans: Sequence[Sequence],
    round_spans: Sequence[Sequence] = (),
    pid: int = 1,
) -> list[dict]:
    """Chrome trace events: one track per stage (its waves), one for admission rounds, and one
    per chosen request (label, record) with its phases, all from the earliest event."""
    starts = [s[2] for s in wave_spans] + [r[1] for r in round_spans]
    starts += [r["arrival_unix_s"] for _, r in chosen if r.get("arrival_unix_s") is not None]
    if not starts:
        return []
    t0 = min(starts)
    stages = sorted({int(s[0]) for s in wave_spans})
    tracks = [f"stage {s}" for s in stages] + ["admission rounds"] + [n for n, _ in chosen]
    events = [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": "wavepp serve"}}]
    events += [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
        for tid, name in enumerate(tracks)
    ]

    def span(tid: int, name: str, start: float, end: float) -> dict:
        return {
            "ph": "X",
            "name": name,
            "pid": pid,
            "tid": tid,
            "ts": 1e6 * (start - t0),
            "dur": 1e6 * max(0.0, end - start),
        }

    events += [span(stages.index(int(s)), f"wave {w}", a, b) for s, w, a, b in wave_spans]
    events += [span(len(stages), f"round {i}", a, b) for i, a, b in round_spans]
    for k, (_, record) in enumerate(chosen):
        t = record.get("arrival_unix_s")
        if t is None:
            continue
        tid = len(stages) + 1 + k
        for phase, seconds in phases(record).items():
            events.append(span(tid, phase, t, t + seconds))
            t += seconds
    return events
