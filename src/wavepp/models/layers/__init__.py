"""The layer modules every family is built from, each made from its spec (`spec/`): norm, one
RoPE, the dense SwiGLU MLP, MoE, GQA, MLA (with the DSA indexer) and KDA. A layer's forward
takes the `ForwardContext` of the stage forward (batch, cache, kernels, RoPE rows)."""
