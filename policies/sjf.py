"""sjf — shortest predicted job first, with aging (DESIGN §7 family).

Rule: the job size of a request is its predicted remaining work in tokens,
    prompt_len + expected output − output tokens already generated   (at least 1),
where the expected output is `predicted_output_tokens` when the engine's predictor is on
(engine.predictor=oracle, optionally noisy), else min(max_tokens, default_output_tokens):
never the true output length. Requests are ordered by size − aging_rate · waiting time
(aging_rate in tokens per second), FCFS among equals, with `priority`'s batching,
head-of-line admission and worst-key preemption. Aging bounds starvation: a long job x is
never passed by a job y arriving more than (size(x) − size(y)) / aging_rate seconds
after it.
Sources: Qiu et al., "Efficient Interactive LLM Serving with Proxy Model-based Sequence
Length Prediction" (SSJF), 2024; Fu et al., "Efficient LLM Scheduling by Learning to
Rank", NeurIPS'24; aging against SJF starvation (Silberschatz et al., OS Concepts).
"""
from __future__ import annotations

from policylab import RequestView
from policies.priority import Priority


class ShortestJobFirst(Priority):
    def __init__(self, name: str | None = None, chunk_size: int | None = 512,
                 max_partial_prefills: int = 1, aging_rate: float = 50.0,
                 default_output_tokens: int = 256):
        super().__init__(name or "sjf", chunk_size, max_partial_prefills, aging_rate)
        if type(default_output_tokens) is not int or default_output_tokens < 1:
            raise ValueError(f"{self.name}: default_output_tokens must be an int >= 1, "
                             f"got {default_output_tokens!r}")
        self.default_output_tokens = default_output_tokens

    def expected_output(self, v: RequestView) -> int:
        predicted = v.predicted_output_tokens
        return predicted if predicted is not None else min(v.max_tokens, self.default_output_tokens)

    def base_key(self, v: RequestView) -> float:
        return float(max(v.prompt_len + self.expected_output(v) - v.num_output_tokens, 1))
