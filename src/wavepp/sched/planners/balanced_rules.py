"""The balanced planner's rules on top of its share, each a switch.

All on (the default) is the planner as it ships; `benchmarks/ablate_planner.py` turns them off
one at a time. What each one fixes, and what it measured, is in `BalancedPlanner`'s docstring.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class BalancedRules:
    # the share: T = c_wave + (W + F) / target_waves
    count_admitting: bool = True  # W counts the requests in or waiting for a round
    count_in_flight: bool = True  # F: the work of the waves in flight counts
    # holding back a thin wave (under PlannerConfig.hold_frac of a share)
    hold_when_full: bool = True  # ... while target_waves waves are in flight
    hold_for_round: bool = True  # ... while fewer are and a round ends soon enough
    # the clamps on T
    min_wave_floor: bool = True  # T >= the time of a b_min-token wave
    first_tokens_cap: bool = True  # equal times: T <= the first M tokens at hand, FCFS
    overhead_cap: bool = True  # equal times: T <= the wave's fixed costs / overhead_frac
    # 2M waves (filling waves)
    double_deep_queue: bool = True  # 2M tokens behind a deep queue (deep_queue_waves)
    cap_double_at_longest: bool = True  # ... no longer than the longest wave of the busy period
    # which chunks
    cold_first: bool = True  # filling with cold prompts: those with nothing sent first
    tail_whole: bool = True  # a rest under tail_frac of a request goes with it
    never_stall: bool = True  # nothing fits: one block of the first request

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def without(self, *names: str) -> "BalancedRules":
        """These rules with `names` switched off; an unknown name raises ValueError."""
        unknown = [n for n in names if n not in self.names()]
        if unknown:
            raise ValueError(
                f"unknown BalancedRules rule {unknown[0]!r}; choose from {', '.join(self.names())}"
            )
        return replace(self, **{n: False for n in names})


ALL_RULES = BalancedRules()
