"""round_robin — each arrival to the next replica in turn (among those that can hold it).

Source: the default of most serving front ends, e.g. Vidur's `round_robin` global scheduler
and llm-d's / NGINX's round-robin balancing.
"""
from policylab import ClusterView, RouteRequest, Router


class RoundRobin(Router):
    reads_load = False            # (a replica's load never enters the choice)

    def __init__(self, name: str = "round_robin", seed: int = 0):
        super().__init__(name, seed)
        self._turn = 0

    def route(self, request: RouteRequest, view: ClusterView) -> int:
        choice = view.replicas[self._turn % len(view.replicas)].index
        self._turn += 1
        return choice
