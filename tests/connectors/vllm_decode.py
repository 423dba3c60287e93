"""Run under vLLM's own venv (PYTHONPATH=src): greedy decode of the prompts in a JSON file with
vLLM alone and with wavepp's transfers, through the WavePPConnector. Prints one JSON line.

    input:  {"model": DIR, "store": DIR, "dtype": "float32", "max_tokens": 16,
             "requests": [{"token_ids": [...], "transfer_id": "..."}, ...]}
    output: {"alone": [[ids]], "handed_off": [[ids]], "cached_alone": [n], "cached_handed_off": [n],
             "misses": n}
"""

import json
import os
import sys

os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")


def main(path: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    spec = json.load(open(path))
    config = KVTransferConfig(kv_connector="WavePPConnector", kv_connector_module_path="wavepp.connectors.vllm",
                              kv_role="kv_consumer", kv_connector_extra_config={"store": spec["store"]})
    longest = max(len(r["token_ids"]) for r in spec["requests"])
    llm = LLM(model=spec["model"], dtype=spec["dtype"], enable_prefix_caching=False, kv_transfer_config=config,
              max_model_len=longest + spec["max_tokens"] + 32, max_num_seqs=8, gpu_memory_utilization=0.2,
              skip_tokenizer_init=spec.get("skip_tokenizer_init", False), block_size=32)
    prompts = [TokensPrompt(prompt_token_ids=r["token_ids"]) for r in spec["requests"]]
    plain = SamplingParams(max_tokens=spec["max_tokens"], temperature=0.0, detokenize=False)
    alone = llm.generate(prompts, plain, use_tqdm=False)
    handed = [SamplingParams(max_tokens=spec["max_tokens"], temperature=0.0, detokenize=False,
                             extra_args={"kv_transfer_params": {"transfer_id": r["transfer_id"]}})
              for r in spec["requests"]]
    handed_off = llm.generate(prompts, handed, use_tqdm=False)
    print("RESULT " + json.dumps({
        "alone": [list(o.outputs[0].token_ids) for o in alone],
        "handed_off": [list(o.outputs[0].token_ids) for o in handed_off],
        "logprob_alone": [o.outputs[0].cumulative_logprob for o in alone],
        "cached_alone": [o.num_cached_tokens for o in alone],
        "cached_handed_off": [o.num_cached_tokens for o in handed_off]}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
