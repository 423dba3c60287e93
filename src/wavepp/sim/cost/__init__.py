"""The cost model: model shapes (from the models' registry and spec) and the named models,
hardware, precision, data-parallel attention, a stage's wave time, and the stage layout (which
layers, how many KV blocks). Pure arithmetic; imports nothing else of the simulator."""
