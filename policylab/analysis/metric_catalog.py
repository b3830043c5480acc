"""Every metric of a run, declared once: its summary.json key, name, unit, formula and what it
is aggregated over (DESIGN §6). The summary's end-of-run printout, `compare`'s columns and
docs/metrics.md all read these declarations; tests check that every number a summary holds is
declared here and documented there.

Units are the summary's (seconds, fractions, per second); a compare column converts to the
unit it shows (`Shown`)."""
from __future__ import annotations

from dataclasses import dataclass

DISTRIBUTION_FIELDS = ("mean", "p50", "p90", "p95", "p99", "p99.9", "max")


@dataclass(frozen=True)
class Metric:
    key: str              # dotted path in summary.json; a distribution holds DISTRIBUTION_FIELDS below it
    name: str             # as printed: "TTFT", "goodput"
    unit: str             # of the summary value: s, fraction, req/s, tok/s, count, service, ...
    formula: str          # what is computed, in one sentence
    over: str             # which requests, steps or windows it aggregates
    distribution: bool = False
    better: str = ""      # min | max: the direction `compare` ranks it in ("" : context, never ranked)

    @property
    def limits(self) -> tuple:
        """The feasible range of the summary value: a confidence interval never leaves it."""
        return LIMITS.get(self.unit, (0.0, float("inf")))


FINISHED = "finished requests"
LIMITS = {"fraction": (0.0, 1.0), "index": (0.0, 1.0)}      # shares and indexes; everything else: ≥ 0
LOWER, HIGHER = "min", "max"
METRICS = {m.key: m for m in (
    Metric("ttft", "TTFT", "s", "first output token time − arrival", FINISHED, True, better=LOWER),
    Metric("tpot", "TPOT", "s", "(finish − first token) / (output tokens − 1)",
           "finished requests with ≥ 2 output tokens", True, better=LOWER),
    Metric("itl", "ITL", "s", "gap between consecutive output tokens of one request",
           "every gap of every finished request, pooled", True, better=LOWER),
    Metric("e2e", "E2E", "s", "finish − arrival", FINISHED, True, better=LOWER),
    Metric("normalized_latency", "normalized latency", "s/token", "E2E / output tokens", FINISHED, True, better=LOWER),
    Metric("queueing_delay", "queueing", "s", "first scheduled − arrival", FINISHED, True, better=LOWER),
    Metric("slo_attainment", "SLO attainment", "fraction",
           "requests meeting both their TTFT and TPOT SLO / all requests",
           "all trace requests: rejected and unfinished ones miss", better=HIGHER),
    Metric("goodput", "goodput", "req/s", "requests meeting their SLOs / makespan (throughput's denominator: "
           "goodput ≤ request throughput)", "all trace requests", better=HIGHER),
    Metric("throughput.output_tokens_per_s", "throughput", "out tok/s", "generated tokens / makespan",
           "all requests", better=HIGHER),
    Metric("throughput.input_tokens_per_s", "input throughput", "in tok/s", "prompt tokens prefilled / makespan",
           "requests that got their first token", better=HIGHER),
    Metric("throughput.requests_per_s", "request throughput", "req/s", "finished requests / makespan",
           FINISHED, better=HIGHER),
    Metric("preemptions", "preemptions", "count", "times a running request lost its KV blocks", "all requests",
           better=LOWER),
    Metric("prefix_cache_hit_rate", "prefix hit", "fraction",
           "prompt tokens served from cached blocks / prompt tokens", "requests that were scheduled", better=HIGHER),
    Metric("kv_utilization.mean", "KV mean", "fraction", "used KV blocks / KV blocks", "steps (unweighted)"),
    Metric("kv_utilization.max", "KV peak", "fraction", "used KV blocks / KV blocks, highest", "steps"),
    Metric("counts.requests", "requests", "count", "trace requests", "the trace"),
    Metric("counts.finished", "finished", "count", "requests that produced all their output", "the trace"),
    Metric("counts.rejected", "rejected", "count", "requests refused (with a reason)", "the trace"),
    Metric("counts.unfinished", "unfinished", "count", "requests still open when a partial run stopped",
           "the trace"),
    Metric("trace_duration", "trace duration", "s", "last − first arrival (the makespan if 0)", "the trace"),
    Metric("makespan", "makespan", "s", "first arrival to the last completion, rejection or step end", "the run"),
    Metric("load.fraction", "offered load", "ratio", "trace.load: the arrival rate / the estimated capacity",
           "runs given trace.load"),
    Metric("load.capacity_rate", "estimated capacity", "req/s", "steady completions per second of chunked with "
           "every request queued, on the sim of the run's model and hardware", "runs given trace.load"),
    Metric("load.trace_rate", "trace rate", "req/s", "requests / arrival span of the trace as read",
           "runs given trace.load"),
    Metric("load.rate_scale", "rate scale", "ratio", "fraction × capacity / trace rate: the trace.rate_scale "
           "the run used", "runs given trace.load"),
    Metric("slo.ttft", "TTFT SLO", "s", "the global TTFT SLO (a request's own SLO wins)", "configuration"),
    Metric("slo.tpot", "TPOT SLO", "s", "the global TPOT SLO (a request's own SLO wins)", "configuration"),
    Metric("qoe", "QoE", "fraction", "area under the tokens-read curve (capped by the expected one) / area under "
           "the expected curve (Andes; policylab/analysis/qoe.py)", "finished requests; a rejected one counts 0",
           True),
    Metric("qoe_expected.ttft", "expected TTFT", "s", "the first token a user expects by (qoe.ttft)", "configuration"),
    Metric("qoe_expected.tds", "reading pace", "tok/s", "tokens per second a user reads (qoe.tds)", "configuration"),
    Metric("fairness.num_clients", "clients", "count", "distinct client names", "the trace"),
    Metric("fairness.jain_index", "Jain (whole run)", "index",
           "Jain's index of each client's received / requested service", "clients, over the whole run", better=HIGHER),
    Metric("fairness.service_difference_max", "service diff max", "service",
           "max − min cumulative service (w_in·prompt + w_out·output tokens) of the backlogged clients",
           "every event with ≥ 2 clients backlogged; the worst", better=LOWER),
    Metric("fairness.service_difference_mean", "service diff mean", "service",
           "as service_difference_max", "time-weighted mean over the same events", better=LOWER),
    Metric("fairness_windows.window_s", "fairness window", "s", "window length (fairness.window, "
           "default 1/20 of the run)", "configuration"),
    Metric("fairness_windows.windows", "windows", "count", "windows the run is cut into", "the run"),
    Metric("fairness_windows.contended_windows", "contended windows", "count",
           "windows with ≥ 2 clients backlogged throughout", "windows"),
    Metric("fairness_windows.service_difference_mean", "service diff (windowed)", "service",
           "max − min service received in the window by the clients backlogged throughout it (VTC's measure)",
           "contended windows, mean", better=LOWER),
    Metric("fairness_windows.service_difference_max", "service diff (windowed, worst)", "service",
           "as service_difference_mean", "contended windows, the worst", better=LOWER),
    Metric("fairness_windows.jain_mean", "Jain (windowed)", "index",
           "Jain's index of the window service of the clients backlogged throughout it",
           "contended windows, mean", better=HIGHER),
    Metric("fairness_windows.jain_min", "Jain (windowed, worst)", "index", "as jain_mean",
           "contended windows, the lowest", better=HIGHER),
    Metric("kv_hierarchy.swap_outs", "swap-outs", "count", "preemptions that moved KV to the host tier",
           "runs with a host KV tier"),
    Metric("kv_hierarchy.swap_ins", "swap-ins", "count", "swapped requests whose KV came back", "runs with a host KV tier"),
    Metric("kv_hierarchy.swapped_out_blocks", "blocks swapped out", "count", "KV blocks copied to the host tier",
           "runs with a host KV tier"),
    Metric("kv_hierarchy.swapped_in_blocks", "blocks swapped in", "count", "KV blocks copied back to the device",
           "runs with a host KV tier"),
    Metric("kv_hierarchy.swap_in_cached_blocks", "swap-in cache hits", "count",
           "blocks of a swapped request found in the device prefix cache instead of copied back",
           "runs with a host KV tier"),
    Metric("kv_hierarchy.transfer_time", "swap transfer", "s", "time the KV transfers took (overlapped or not)",
           "runs with a host KV tier", better=LOWER),
    Metric("kv_hierarchy.recomputed_tokens", "recomputed tokens", "count",
           "computed tokens lost to recompute preemptions", "runs with a host KV tier", better=LOWER),
    Metric("sessions.count", "sessions", "count", "sessions of a closed-loop replay", "the workload"),
    Metric("sessions.completed", "sessions completed", "count", "sessions whose every turn finished", "sessions"),
    Metric("sessions.turns_mean", "turns per session", "count", "turns / sessions", "sessions"),
    Metric("sessions.completion_time", "session time", "s", "last turn's finish − first turn's arrival",
           "completed sessions", True, better=LOWER),
    Metric("sessions.ttft_by_turn", "TTFT by turn", "s", "TTFT of the turns with this index (key: the index)",
           "finished turns, per turn index (the first 16)"),
    Metric("speculative.proposed_tokens", "drafts proposed", "count", "draft tokens verified (k per "
           "verification)", "runs whose policy gave drafts"),
    Metric("speculative.accepted_tokens", "drafts accepted", "count",
           "tokens a verification emitted beyond the one a plain decode gives", "runs whose policy gave drafts"),
    Metric("speculative.rejected_tokens", "drafts rejected", "count",
           "proposed − accepted: drafts the target disagreed with, or past the request's end", "runs whose policy gave drafts"),
    Metric("speculative.verifications", "verifications", "count",
           "(request, step) pairs that verified ≥ 1 draft", "runs whose policy gave drafts"),
    Metric("speculative.emitted_tokens", "speculative tokens", "count",
           "output tokens emitted by verifications (accepted + one each)", "runs whose policy gave drafts"),
    Metric("speculative.released_blocks", "released blocks", "count",
           "KV blocks grown for drafts and freed after their verification", "runs whose policy gave drafts"),
    Metric("speculative.acceptance_rate", "acceptance", "fraction", "accepted / proposed draft tokens",
           "runs whose policy gave drafts"),
    Metric("speculative.tokens_per_step", "tokens/step", "tokens", "emitted tokens / verifications: "
           "what a speculating decode gains per step", "runs whose policy gave drafts"),
    Metric("kv_hierarchy.device_hit_rate", "device hit", "fraction",
           "prompt tokens served from the device prefix cache / prompt tokens of started requests", "runs with prefix tiers",
           better=HIGHER),
    Metric("kv_hierarchy.host_hit_rate", "host hit", "fraction",
           "prompt tokens served from the prefix cache's host tier / prompt tokens of started requests", "runs with prefix tiers",
           better=HIGHER),
    Metric("kv_hierarchy.disk_hit_rate", "disk hit", "fraction",
           "prompt tokens served from the prefix cache's disk tier / prompt tokens of started requests", "runs with prefix tiers",
           better=HIGHER),
    Metric("kv_hierarchy.host_hit_blocks", "host-tier hits", "count",
           "cached blocks promoted from the host tier to the device", "runs with prefix tiers"),
    Metric("kv_hierarchy.disk_hit_blocks", "disk-tier hits", "count",
           "cached blocks promoted from the disk tier to the device", "runs with prefix tiers"),
    Metric("kv_hierarchy.host_hit_tokens", "host-tier hit tokens", "count",
           "prompt tokens of the blocks promoted from the host tier", "runs with prefix tiers"),
    Metric("kv_hierarchy.disk_hit_tokens", "disk-tier hit tokens", "count",
           "prompt tokens of the blocks promoted from the disk tier", "runs with prefix tiers"),
    Metric("kv_hierarchy.host_offloaded_blocks", "blocks offloaded", "count",
           "cached blocks the device evicted, copied to the host tier", "runs with prefix tiers"),
    Metric("kv_hierarchy.disk_offloaded_blocks", "blocks to disk", "count",
           "cached blocks the full host tier pushed down to the disk tier", "runs with prefix tiers"),
    Metric("kv_hierarchy.dropped_blocks", "blocks dropped", "count",
           "cached blocks pushed out of the lowest tier (lost)", "runs with prefix tiers"),
    Metric("kv_hierarchy.superseded_blocks", "blocks superseded", "count",
           "lower-tier copies dropped because the device computed the block again", "runs with prefix tiers"),
    Metric("kv_hierarchy.host_bytes", "host-link bytes", "bytes",
           "prefix-tier bytes over the device-host link, both ways", "runs with prefix tiers"),
    Metric("kv_hierarchy.disk_bytes", "disk bytes", "bytes",
           "prefix-tier bytes read from and written to the disk tier", "runs with prefix tiers"),
    Metric("kv_hierarchy.host_transfer_time", "host-tier transfer", "s",
           "time the prefix tiers' device-host copies took (overlapped or not)", "runs with prefix tiers",
           better=LOWER),
    Metric("kv_hierarchy.disk_transfer_time", "disk-tier transfer", "s",
           "time the disk tier's reads and writes took (overlapped or not)", "runs with prefix tiers", better=LOWER),
    Metric("programs.jct", "JCT", "s", "finish − arrival, the tools' time included (job completion time)",
           "finished requests (runs with tool calls)", True, better=LOWER),
    Metric("programs.tool_time", "time paused", "s", "seconds a request waited for its tools (sum of its calls' "
           "durations)", "finished requests with ≥ 1 tool call", True),
    Metric("programs.programs_with_calls", "programs with calls", "count", "finished requests that made a tool call",
           "runs with tool calls"),
    Metric("programs.tool_calls", "tool calls", "count", "pauses for a tool call", "runs with tool calls"),
    Metric("client_timeout.abandoned", "abandoned", "count",
           "requests their client gave up on (not finished client_timeout s after arriving): rejected",
           "runs with trace.client_timeout", better=LOWER),
    Metric("client_timeout.timeout_s", "client timeout", "s", "the clients' timeout (trace.client_timeout)",
           "runs with trace.client_timeout"),
    Metric("migration.migrations", "migrations asked", "count", "moves the rebalancing router asked for",
           "runs with live migration"),
    Metric("migration.committed", "migrations", "count", "running requests moved to another replica",
           "runs with live migration"),
    Metric("migration.refused", "migrations refused", "count",
           "moves the destination had no free blocks to reserve for", "runs with live migration"),
    Metric("migration.aborted", "migrations aborted", "count", "moves stopped before their stop-and-copy (the "
           "request finished or was preempted on the source, or the destination ran out of blocks)",
           "runs with live migration"),
    Metric("migration.stages", "migration stages", "count", "copies made while the request kept decoding",
           "runs with live migration"),
    Metric("migration.blocks_copied", "migrated blocks", "count", "KV blocks sent over the link (stages and "
           "stop-and-copy)", "runs with live migration"),
    Metric("migration.bytes_copied", "migrated bytes", "bytes", "KV bytes sent over the link",
           "runs with live migration"),
    Metric("migration.copy_time", "migration link time", "s", "link time of every stage and stop-and-copy",
           "runs with live migration"),
    Metric("migration.downtime", "migration downtime", "s", "seconds migrated requests spent out of every batch "
           "(stop-and-copy), summed", "runs with live migration", better=LOWER),
    Metric("migration.max_downtime", "max migration downtime", "s", "the longest stop-and-copy",
           "runs with live migration", better=LOWER),
    Metric("programs.kept", "KV kept", "count", "tool calls whose request kept its device KV", "runs with tool calls"),
    Metric("programs.freed", "KV freed", "count", "tool calls whose request's KV was freed (recompute on resume)",
           "runs with tool calls"),
    Metric("programs.offloaded", "KV offloaded", "count", "tool calls whose request's KV went to the host tier",
           "runs with tool calls"),
    Metric("programs.offload_fallbacks", "offload fallbacks", "count",
           "offloads freed instead: the host tier had no room (or none is configured)", "runs with tool calls"),
    Metric("programs.kept_released", "kept KV released", "count",
           "kept KV freed because the policy left the resumed request idle with nothing else to run",
           "runs with tool calls"),
    Metric("programs.recomputed_tokens", "tool recomputed tokens", "count",
           "computed tokens lost at tool calls that the prefix cache did not give back", "runs with tool calls",
           better=LOWER),
    Metric("programs.offloaded_blocks", "tool offloaded blocks", "count", "KV blocks copied to the host tier at tool calls",
           "runs with tool calls"),
    Metric("programs.paused_time", "total time paused", "s", "sum of every tool call's duration", "runs with tool calls"),
    Metric("energy.total_j", "energy", "J", "busy + idle energy of every GPU", "the run (GPU power model)",
           better=LOWER),
    Metric("energy.busy_j", "busy energy", "J", "Σ over steps of power x duration x GPUs",
           "every step (runs on a GPU power model)"),
    Metric("energy.idle_j", "idle energy", "J", "idle power x (GPUs x makespan − GPU-seconds of steps)",
           "the run (GPU power model)"),
    Metric("energy.mean_power_w", "mean power", "W", "total energy / (GPUs x makespan)", "the run (GPU power model)"),
    Metric("energy.per_output_token_j", "energy/token", "J/token", "total energy / generated tokens",
           "the run (GPU power model)", better=LOWER),
    Metric("energy.per_request_j", "energy/request", "J",
           "a request's share of the energy of each step it ran in (by tokens computed there)",
           "finished requests (GPU power model)", True, better=LOWER),
    Metric("energy.per_good_request_j", "energy/good request", "J",
           "total energy / requests meeting their SLOs (energy per unit of goodput)", "the run (GPU power model)",
           better=LOWER),
    Metric("energy.throttled_share", "throttled", "fraction",
           "step time run below the set clock to stay within the board limit / step time (power_limit=throttle)",
           "every step (GPU power model)"),
    Metric("energy.gpus", "GPUs", "count", "GPUs powered (replicas x tensor x pipeline parallel)", "configuration"),
    Metric("energy.gpu_clock_mhz", "GPU clock", "MHz", "the SM clock the run ended at (null: the maximum)",
           "configuration"),
    Metric("quality.positions", "scored positions", "count",
           "sampled positions scored by the full-precision reference", "runs with a quality reference"),
    Metric("quality.greedy_agreement", "greedy agreement", "fraction",
           "positions where the quantised and full-precision argmax agree / positions", "runs with a quality reference",
           better=HIGHER),
    Metric("quality.logit_rmse", "logit error", "ratio",
           "rms(quantised − reference logits) / rms(reference logits)", "every scored position, pooled", better=LOWER),
    Metric("quality.max_logit_error", "max logit error", "logit", "largest |quantised − reference logit|",
           "every scored position", better=LOWER),
    Metric("quality.kl_divergence", "KL divergence", "nats", "mean KL(reference ‖ quantised) of the next-token "
           "distributions", "every scored position", better=LOWER),
    Metric("cluster.num_replicas", "replicas", "count", "engine replicas", "cluster runs"),
    Metric("cluster.load_imbalance", "load imbalance", "ratio", "busiest replica's busy time / mean busy time",
           "replicas", better=LOWER),
    Metric("cluster.goodput_per_gpu", "goodput/GPU", "req/s", "goodput / replicas", "cluster runs", better=HIGHER),
)}
# per replica, under cluster.replicas.<name>
REPLICA_METRICS = {m.key: m for m in (
    Metric("requests", "requests", "count", "requests admitted to the replica", "the replica"),
    Metric("busy_time", "busy time", "s", "sum of the replica's step durations", "the replica's steps"),
    Metric("utilization", "utilization", "fraction", "busy time / makespan", "the replica"),
    Metric("prefix_cache_hit_rate", "prefix hit", "fraction", "as the run's, on this replica",
           "requests scheduled there"),
    Metric("preemptions", "preemptions", "count", "as the run's, on this replica", "the replica"),
    Metric("goodput", "goodput", "req/s", "its requests meeting their SLOs / the run's makespan", "the replica"),
    Metric("steps", "steps", "count", "engine steps run", "the replica"),
)}
# summary entries that are not metrics: the run's identity, its inputs and its bookkeeping
NOT_METRICS = ("status", "partial", "error", "policy", "router", "rejections", "config", "trace_report", "load.estimate",
               "cost_model", "missing_files", "files", "wall", "cluster.replicas", "sessions.mode", "sessions.users")

SCALE = {("s", "ms"): 1e3, ("fraction", "%"): 100.0}


@dataclass(frozen=True)
class Shown:
    """A compare column: a metric (one field of a distribution), in the unit it is shown in,
    ranked in the catalog's direction unless `rank` is off (a column shown for context)."""
    metric: str
    field: str = ""
    unit: str = ""               # shown unit ("" = the metric's own)
    digits: int = 2
    rank: bool = True

    @property
    def better(self) -> str:
        """min | max (the metric's declared direction), or "" when this column is never ranked."""
        return METRICS[self.metric].better if self.rank else ""

    @property
    def proportion(self) -> bool:
        """A share of requests, tokens or steps: its interval is Wilson's, inside [0, 100] %."""
        return METRICS[self.metric].unit == "fraction"

    @property
    def limits(self) -> tuple:
        """The feasible range in the shown unit."""
        lo, hi = METRICS[self.metric].limits
        return lo * self.scale, hi * self.scale

    @property
    def path(self) -> tuple:
        return tuple(self.metric.split(".")) + ((self.field,) if self.field else ())

    @property
    def scale(self) -> float:
        return SCALE.get((METRICS[self.metric].unit, self.unit), 1.0)

    @property
    def label(self) -> str:
        m = METRICS[self.metric]
        unit = self.unit or m.unit
        name = f"{m.name} {self.field}" if self.field else m.name
        return f"{name} ({unit})" if unit not in ("count", "index", "ratio", "service") else name


def lookup(key: str) -> Metric:
    """The declaration of a summary key (a distribution's field resolves to its distribution)."""
    if key in METRICS:
        return METRICS[key]
    for field in DISTRIBUTION_FIELDS:
        head = key.removesuffix("." + field)
        if head != key and head in METRICS and METRICS[head].distribution:
            return METRICS[head]
    if key.startswith("cluster.replicas."):
        return REPLICA_METRICS[key.rsplit(".", 1)[1]]
    if key.startswith("sessions.ttft_by_turn."):
        return METRICS["sessions.ttft_by_turn"]
    raise KeyError(key)
