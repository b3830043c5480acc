"""random — each arrival to a uniformly drawn replica (seeded: same seed, same choices).

Source: Vidur's `random` global scheduler; the baseline of Mitzenmacher's power-of-two-choices analysis.
"""
import numpy as np

from policylab import ClusterView, RouteRequest, Router


class RandomRouter(Router):
    reads_load = False            # (a replica's load never enters the choice)

    def __init__(self, name: str = "random", seed: int = 0):
        super().__init__(name, seed)
        self._rng = np.random.default_rng(seed)

    def route(self, request: RouteRequest, view: ClusterView) -> int:
        return view.replicas[int(self._rng.integers(len(view.replicas)))].index
