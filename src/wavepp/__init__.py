"""wavepp: pipeline-parallel LLM prefill with prefix reuse across independently cached stages."""

__version__ = "0.1.0"
