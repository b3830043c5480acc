"""Policies the vLLM CLI tests run by `policy._target_=tests.vllm_policies.NAME`."""
from __future__ import annotations

from policies.chunked import Chunked


class UndeclaredDrafts(Chunked):
    """A user's policy that plans draft tokens without declaring speculation (`Policy.features`):
    nothing refuses it before the run, so vLLM's scheduler adapter must."""
    features = ()

    def schedule(self, view):
        plan = super().schedule(view)
        plan.spec_tokens = {rid: 1 for rid in plan.num_scheduled_tokens if rid in view.decoding}
        return plan
