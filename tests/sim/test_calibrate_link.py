"""The hop between two stages, from measured wave spans (sim/studies/calibrate.py
`link_latency_s`): waves that found stage 1 idle give it; a wave queued behind stage 1's last
one would count its wait as link (the median of every gap was 0.7 s for a 1 ms hop)."""

import pytest

from wavepp.sim.studies.calibrate import link_latency_s


def test_only_waves_that_found_stage_1_idle_count():
    hop = 0.001
    spans = []
    t = 0.0
    for w in range(4):  # a slow stage 1: waves 1-3 queue behind the one before
        spans.append((0, w, t, t + 0.01))
        spans.append((1, w, t + 0.01 + hop + 0.05 * w, t + 0.01 + hop + 0.05 * w + 0.06))
        t += 0.01
    # a pause: stage 1 drains, and the next two waves find it idle
    for w in (4, 5):
        start = 1.0 + (w - 4) * 0.2
        spans.append((0, w, start, start + 0.01))
        spans.append((1, w, start + 0.01 + hop, start + 0.01 + hop + 0.02))
    assert link_latency_s(spans) == pytest.approx(hop)
    assert link_latency_s(spans[:8]) == 0.0  # every wave queued: no measure of the hop
