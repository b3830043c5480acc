"""session — sticky by client: a client's first request goes to the least loaded replica, and every
later one to the same replica (while it can hold the request; else the least loaded again).

Source: session affinity of serving gateways (llm-d's session-affinity scorer, Dynamo's KV-aware
routing of multi-turn conversations): a conversation's turns find their own earlier KV.
"""
from policylab import ClusterView, RouteRequest, Router


class Session(Router):
    def __init__(self, name: str = "session", seed: int = 0):
        super().__init__(name, seed)
        self._home: dict = {}          # client -> replica index

    def route(self, request: RouteRequest, view: ClusterView) -> int:
        home = self._home.get(request.client)
        if home is None or all(r.index != home for r in view.replicas):
            home = self._home[request.client] = view.least_loaded().index
        return home
