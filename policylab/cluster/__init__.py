"""Cluster scheduling: N engines (replicas) on one virtual clock, a router plugin choosing the
replica of each arrival, and optional prefill/decode disaggregation with a KV-transfer link.

A layer above the core, the data planes and the traces (it drives `Engine`s through their
stepping API), below the analysis and the apps.
"""
from policylab.cluster.config import ClusterConfig, LinkConfig
from policylab.cluster.driver import Cluster, Replica
from policylab.cluster.result import ClusterResult
from policylab.cluster.router import ClusterView, ReplicaView, RouteRequest, Router, RouteViolation, validate_route

__all__ = ["Cluster", "ClusterConfig", "ClusterResult", "ClusterView", "LinkConfig", "Replica", "ReplicaView",
           "RouteRequest", "Router", "RouteViolation", "validate_route"]
