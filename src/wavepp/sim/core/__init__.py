"""The event core: a virtual clock (events.py) and the pipeline that drives the real leader and
stage servers through it (pipeline.py). Imports nothing else of the simulator."""
