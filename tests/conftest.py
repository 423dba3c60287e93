"""Suite-wide settings."""

import os

# Kernel paths are chosen by timing at stage start-up; under a loaded machine two processes may
# choose differently and their bf16 numerics differ. The suite pins them (the stage processes
# inherit the environment); tests/models/test_kernel_choice.py checks the timed choice itself.
os.environ.setdefault("WAVEPP_LINEAR_KERNEL", "linear")
os.environ.setdefault("WAVEPP_ATTENTION_KERNEL", "chunked")
