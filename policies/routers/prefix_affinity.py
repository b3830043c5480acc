"""prefix_affinity — the replica holding the longest cached prefix of the prompt, among those whose
load is within a bound of the least loaded; the least loaded when none holds any of it.

Source: SGLang's cache-aware router (sgl-router: prefix match unless the load imbalance exceeds a
threshold, then shortest queue) and llm-d's prefix-cache scorer. Here the prefix length is read
from each replica's real prefix cache (a side-effect-free lookup), not an approximate tree.
"""
from policylab import ClusterView, RouteRequest, Router


class PrefixAffinity(Router):
    def __init__(self, name: str = "prefix_affinity", seed: int = 0, load_factor: float = 1.5,
                 load_slack_tokens: int = 4096):
        """A replica is a candidate while its outstanding tokens are ≤ load_factor × the least
        loaded replica's + load_slack_tokens (so an idle cluster still follows the cache)."""
        super().__init__(name, seed)
        if load_factor < 1 or load_slack_tokens < 0:
            raise ValueError(f"prefix_affinity needs load_factor >= 1 and load_slack_tokens >= 0, "
                             f"got {load_factor}, {load_slack_tokens}")
        self.load_factor, self.load_slack_tokens = load_factor, load_slack_tokens

    def route(self, request: RouteRequest, view: ClusterView) -> int:
        loads = {r.index: r.outstanding_tokens for r in view.replicas}
        bound = min(loads.values()) * self.load_factor + self.load_slack_tokens
        candidates = [r for r in view.replicas if loads[r.index] <= bound]
        best = max(candidates, key=lambda r: (r.cached_prefix_tokens(request), -loads[r.index], -r.index))
        return best.index
