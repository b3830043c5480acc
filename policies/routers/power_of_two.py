"""power_of_two — draw two distinct replicas at random, send to the one with fewer outstanding tokens.

Source: Mitzenmacher, "The Power of Two Choices in Randomized Load Balancing" (IEEE TPDS 2001);
the `power_of_two` policy of SGLang's router.
"""
import numpy as np

from policylab import ClusterView, RouteRequest, Router


class PowerOfTwo(Router):
    def __init__(self, name: str = "power_of_two", seed: int = 0):
        super().__init__(name, seed)
        self._rng = np.random.default_rng(seed)

    def route(self, request: RouteRequest, view: ClusterView) -> int:
        if len(view.replicas) == 1:
            return view.replicas[0].index
        a, b = self._rng.choice(len(view.replicas), size=2, replace=False)
        return view.least_loaded((view.replicas[a], view.replicas[b])).index
