"""Connectors that let a decode engine take wavepp's KV: `vllm.py` (a vLLM KV connector). Each
imports only what its engine's environment has."""
