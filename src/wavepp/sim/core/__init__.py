"""The event core: a virtual clock (events.py), the pipeline that drives the real leader and
stage servers through it (pipeline.py), and the KV store the stages of several pipelines may
share (shared_store.py). Imports nothing else of the simulator."""
