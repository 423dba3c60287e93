"""Generative scoring (/v1/score, as SGLang and vLLM define it): one query, many items, and
label tokens; for each item, the next-token probabilities of the labels after query + item
(item + query with item_first).

How it maps onto the pipeline: each (item, label) pair is one request whose prompt is
query + item + [label], with prompt logprobs from the last position of query + item
(logprob_start = len(query + item) - 1): the label's logprob there is the score. So

    [0, len(query))                    shared by every item: computed once, then reused
    [len(query), len(query + item))    shared by the item's labels: reused up to the block
                                       holding logprob_start
    the label                          one more token per label

The query is the common prefix that prefix reuse is built for: after the first request
computes it, every other item and label reuses its full blocks on every stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from wavepp.serve.completion_request import ScoreRequest


@dataclass(frozen=True)
class ScorePrompt:
    item: int
    label: int
    token_ids: list[int]
    logprob_start: int  # the last position of query + item


def score_prompts(
    query: list[int], items: list[list[int]], labels, item_first: bool
) -> list[ScorePrompt]:
    out = []
    for i, item in enumerate(items):
        context = item + query if item_first else query + item
        for j, label in enumerate(labels):
            out.append(ScorePrompt(i, j, context + [int(label)], len(context) - 1))
    return out


def score_response(req: ScoreRequest, prompts: list[ScorePrompt], results, model: str) -> dict:
    """scores[i][j]: item i's probability of label j (softmax over the labels with
    apply_softmax, else the probability over the whole vocabulary)."""
    logprobs = [[0.0] * len(req.label_token_ids) for _ in req.items]
    for p, r in zip(prompts, results):
        logprobs[p.item][p.label] = r.prompt_logprobs[0][0]
    scores = []
    for row in logprobs:
        if req.apply_softmax:
            top = max(row)
            z = sum(math.exp(x - top) for x in row)
            scores.append([math.exp(x - top) / z for x in row])
        else:
            scores.append([math.exp(x) for x in row])
    num_prompt = sum(len(p.token_ids) for p in prompts)
    return {
        "object": "scoring",
        "model": model,
        "scores": scores,
        "usage": {
            "prompt_tokens": num_prompt,
            "completion_tokens": 0,
            "total_tokens": num_prompt,
            "prompt_tokens_details": {"cached_tokens": sum(r.num_cached_tokens for r in results)},
        },
    }
