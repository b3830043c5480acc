"""What tensor and pipeline parallelism add to a step: the collectives and the pipeline bubble.

Tensor parallelism (Megatron layout, as vLLM runs it) shards every layer's GEMMs and attention
heads over `tp` GPUs and joins the shards with two all-reduces of the n x hidden activations per
layer (after the attention output projection and after the MLP down projection), plus one after
the vocabulary-parallel embedding. A ring all-reduce of S bytes over p GPUs moves 2(p-1)/p x S
over each GPU's link in 2(p-1) steps, so

    t(S) = collective_latency + 2(p-1) x link_latency + 2(p-1)/p x S / link_bandwidth

`link_bandwidth` is the bus bandwidth a ring reaches (what nccl-tests calls busbw), not the
datasheet's per-direction peak; `collective_latency` is what even a tiny collective costs (the
launch, the protocol's handshakes). configs/link/*.yaml and each GPU's YAML give the fitted
numbers and their source.

Pipeline parallelism splits the layers evenly over `pp` stages. A step's batch goes through as
m = min(pp, requests) micro-batches (a request is never split), so the step takes
(m + pp - 1) stage-times of one micro-batch: with one request the stages run one after the
other (no speed-up, only the hand-offs added), with many the bubble shrinks to (pp - 1) / m.
Each hand-off sends the micro-batch's activations (tokens x hidden) point to point.
"""
from __future__ import annotations

from policylab.core.config import HardwareConfig


class Link:
    """Collective times over the GPU-to-GPU link of one parallel group, as the serving engine
    implements them (`policylab.dataplane.serving_engine`: NCCL's ring, or vLLM's own kernels for
    the all-reduces they take, and what an eager engine adds to each NCCL collective)."""

    def __init__(self, hw: HardwareConfig, tp: int, engine=None):
        self.name, self.tp, self.bw = hw.link, tp, hw.link_bandwidth
        self.engine = engine
        overhead = engine.cfg.collective_overhead if engine is not None else 0.0
        self.ring_latency = hw.collective_latency + 2 * (tp - 1) * hw.link_latency + overhead
        self.gather_latency = (hw.collective_latency + 2 * (tp - 1) * hw.link_latency) / 2 + overhead
        self.p2p_latency = hw.collective_latency + hw.link_latency
        self.ring_share = 2 * (tp - 1) / tp
        self._custom = engine is not None and engine.cfg.all_reduce == "custom"

    def all_reduce(self, size: float) -> float:
        """All-reduce of `size` bytes among the tp GPUs (0 for one GPU): the engine's custom kernel
        where it takes the message, else a ring."""
        if self.tp == 1:
            return 0.0
        if self._custom:
            t = self.engine.custom_all_reduce(self.tp, size, self.bw)
            if t is not None:
                return t
        return self.ring_latency + self.ring_share * size / self.bw

    def all_gather(self, size: float) -> float:
        """Ring all-gather of a `size`-byte result of which each GPU holds 1/tp (half an all-reduce)."""
        if self.tp == 1:
            return 0.0
        return self.gather_latency + self.ring_share / 2 * size / self.bw

    def describe(self) -> dict:
        out = {"name": self.name, "bandwidth": self.bw, "ring_latency": self.ring_latency}
        if self._custom:
            out["all_reduce"] = "custom"
        return out

    def send(self, size: float) -> float:
        """One point-to-point hand-off of `size` bytes (pipeline stages)."""
        return self.p2p_latency + size / self.bw


def check_parallel(tp: int, pp: int, heads: int, layers: int) -> None:
    """TP and PP must be >= 1 and PP at most the layer count. A TP that does not divide the heads
    is priced, not refused: the busiest GPU holds ceil(heads / tp) of them and sets the pace
    (`ModelShape`), where vLLM itself would refuse the layout."""
    if tp < 1 or pp < 1:
        raise ValueError(f"dataplane.tensor_parallel and dataplane.pipeline_parallel must be >= 1, got {tp} and {pp}")
    if pp > layers:
        raise ValueError(f"dataplane.pipeline_parallel={pp} exceeds the model's {layers} layers")


def micro_batches(pp: int, requests: int) -> int:
    """How many micro-batches a step of `requests` requests fills a `pp`-stage pipeline with."""
    return max(1, min(pp, requests))


def pipelined(stage_time: float, handoff: float, pp: int, m: int) -> float:
    """Time of m micro-batches through pp stages, each stage `stage_time` per micro-batch."""
    return (m + pp - 1) * (stage_time + handoff) - handoff
