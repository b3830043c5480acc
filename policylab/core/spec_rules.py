"""The contract's rules of speculative tokens (`StepPlan.spec_tokens`), checked by
`validate_plan` with every other rule (docs/speculative-decoding.md)."""
from __future__ import annotations

from policylab.core.violation import ContractViolation


def check_spec_tokens(view, plan, policy: str) -> tuple:
    """The rules of `plan.spec_tokens` (spec_type, spec_nonneg, spec_decoding, spec_max_tokens):
    (extra tokens, extra KV blocks) the drafts add to the plan's totals. k drafts make k + 1
    tokens of the step's budget and need the blocks of k + 1 tokens."""
    spec = plan.spec_tokens
    if not isinstance(spec, dict):
        raise ContractViolation(policy, "spec_type", f"spec_tokens must be a mapping req_id -> k, got "
                                f"{type(spec).__name__}")
    sched, decoding, live = plan.num_scheduled_tokens, view.decoding, view.by_id
    tokens = blocks = 0
    for rid, k in spec.items():
        if type(k) is not int:
            raise ContractViolation(policy, "spec_type", f"request {rid}: speculative token count must be "
                                    f"int, got {k!r}")
        if k < 0:
            raise ContractViolation(policy, "spec_nonneg", f"request {rid}: {k} speculative tokens (k >= 0)")
        if not k:
            continue
        if rid not in decoding or sched.get(rid) != 1:
            raise ContractViolation(policy, "spec_decoding", f"request {rid} gets {k} speculative tokens but "
                                    "is not a decoding request scheduled for its 1 token this step")
        v = live[rid]
        room = v.max_tokens - v.num_output_tokens - 1
        if k > room:
            raise ContractViolation(policy, "spec_max_tokens", f"request {rid} gets {k} speculative tokens but "
                                    f"can emit only {room + 1} more (max_tokens={v.max_tokens}, "
                                    f"{v.num_output_tokens} generated): k <= {max(room, 0)}")
        tokens += k
        blocks += view.blocks_needed(v, 1 + k) - view.blocks_needed(v, 1)
    return tokens, blocks
