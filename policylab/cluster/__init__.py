"""Cluster scheduling: N engines (replicas) on one virtual clock, a router plugin choosing the
replica of each arrival (the routing contract is in the core: `policylab.core.routing`), and
optional prefill/decode disaggregation with a KV-transfer link.

A layer above the core, the data planes and the traces (it drives `Engine`s through their
stepping API), below the analysis and the apps.
"""
from policylab.cluster.config import ClusterConfig, LinkConfig
from policylab.cluster.driver import Cluster, Replica
from policylab.cluster.result import ClusterResult

__all__ = ["Cluster", "ClusterConfig", "ClusterResult", "LinkConfig", "Replica"]
