"""The roofline's query-key pair count: C-level integer sums, the same number the per-request
float formula n·(c + (n+1)/2) gives (so no replay moves when the faster form is used)."""
from hypothesis import given, strategies as st

from policylab.core.config import HardwareConfig, ModelConfig
from policylab.dataplane.roofline import Roofline, smooth_max

entries = st.lists(st.tuples(st.integers(1, 16384), st.integers(0, 200_000)), min_size=1, max_size=300).filter(
    lambda b: any(n > 1 for n, _ in b))    # a prefill chunk in the batch: the per-request branch


@given(entries)
def test_attention_time_equals_the_per_request_formula(batch):
    q, ctx = [n for n, _ in batch], [c for _, c in batch]
    roof = Roofline(ModelConfig(), HardwareConfig())
    pairs = sum(n * (c + (n + 1) / 2) for n, c in zip(q, ctx))
    context, tokens = sum(ctx), sum(q)
    want = roof.shape.layers * roof.latency + smooth_max(roof._s_per_attn_pair * pairs,
                                                          roof._s_per_kv_token * (context + 2 * tokens))
    assert roof.attention_time(q, ctx, tokens) == want
