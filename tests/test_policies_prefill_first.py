"""prefill_first's watermark (vLLM v0's): admissions leave a share of the KV cache free."""
import pytest

from policies.prefill_first import PrefillFirst
from policylab.core.config import EngineConfig
from policylab.core.request import TraceRequest as T
from policylab.testing.replay import replay

CFG = EngineConfig(block_size=16, num_blocks=100, max_num_batched_tokens=4096, max_num_seqs=8)


def test_an_admission_leaves_the_watermark_free():
    """Two prompts of 46 blocks: the second would leave 8 blocks free, under the watermark of 10."""
    trace = [T(0.0, 46 * 16 - 8, 4), T(0.0, 46 * 16 - 8, 4)]
    _, marked = replay(PrefillFirst(watermark=0.1), trace, CFG)
    _, unmarked = replay(PrefillFirst(watermark=0.0), trace, CFG)
    assert marked[0].plan.num_scheduled_tokens == {0: 728}
    assert unmarked[0].plan.num_scheduled_tokens == {0: 728, 1: 728}


def test_decodes_ignore_the_watermark():
    """A request that ends up holding all but one block, far past a 50 % watermark, still decodes to the end."""
    result, records = replay(PrefillFirst(watermark=0.5), [T(0.0, 40, 60)], EngineConfig(block_size=16, num_blocks=8))
    assert result.requests[0].status.value == "finished" and len(result.requests[0].output_ids) == 60


def test_a_prompt_above_the_cache_less_the_watermark_is_rejected_with_the_reason():
    cfg = EngineConfig(block_size=16, num_blocks=20, max_num_batched_tokens=4096, max_num_seqs=8)
    result, _ = replay(PrefillFirst(watermark=0.2), [T(0.0, 17 * 16, 2), T(0.0, 20, 2)], cfg)
    first, second = result.requests
    assert first.status.value == "rejected" and "watermark" in first.reject_reason
    assert second.status.value == "finished"


def test_the_default_is_vllm_v0s_and_bad_values_are_refused():
    assert PrefillFirst().watermark == 0.01
    with pytest.raises(ValueError, match="watermark"):
        PrefillFirst(watermark=1.0)
