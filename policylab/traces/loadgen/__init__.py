"""Load generators' result files read as benchmarks: the workload as a trace, the server's knobs
and the measured latencies per stage (vLLM's `vllm bench serve` / benchmark_serving JSON,
Kubernetes inference-perf's report folders). `python -m policylab fidelity-e2e` replays them."""
from policylab.traces.loadgen.benchmark import Benchmark, MeasuredStage, ServerKnobs

__all__ = ["Benchmark", "MeasuredStage", "ServerKnobs"]
