"""The outside frameworks' executor loops, step by step (loop_sim.py over virtual_channels.py,
with the host costs of loop_costs.py), and their mechanisms as named switches (trtllm.py,
sglang.py, vllm_pp.py). Built on the event core."""
