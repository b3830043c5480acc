"""least_loaded — the replica with the fewest outstanding tokens (prefill tokens not yet computed
plus the decode tokens a scheduler can know are owed).

Source: Vidur's `lor` (least outstanding requests) global scheduler, generalised from requests
to tokens, as llm-d's load-aware scorer and SGLang's shortest-queue fallback weigh queued work.
"""
from policylab import ClusterView, RouteRequest, Router


class LeastLoaded(Router):
    def __init__(self, name: str = "least_loaded", seed: int = 0):
        super().__init__(name, seed)

    def route(self, request: RouteRequest, view: ClusterView) -> int:
        return view.least_loaded().index
