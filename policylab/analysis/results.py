"""Result files of a run and the summary printed at its end.

A run directory gets `requests.parquet` (one row per trace request), `steps.parquet` (one row
per engine step) and `summary.json`. Every file is written to a temporary name, synced and
renamed over the target, so a crash or a full disk never leaves a half-written file behind;
`policylab.analysis.result_stream` writes them (in row groups while a run goes, or at once).
"""
from __future__ import annotations

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from policylab.core.result import RunResult
from policylab.analysis.metric_catalog import METRICS
from policylab.analysis.metrics import MAX_LISTED_REJECTIONS, add_qoe, flat_token_times, request_table, step_table, \
    summarize, token_facts
from policylab.analysis.result_files import ResultSettings, ResultsWriteError  # noqa: F401 (re-exported)
from policylab.analysis.result_stream import ResultStream


def summarize_run(result: RunResult, settings: ResultSettings | None = None) -> tuple:
    """(requests table, steps table, summary) of a replay, with the settings' SLOs, fairness and QoE."""
    settings = settings or ResultSettings()
    requests, steps = request_table(result, settings.slo), step_table(result)
    flat = flat_token_times(requests["token_times"].tolist())
    add_qoe(requests, flat, settings.qoe)
    return requests, steps, summarize(requests, steps, result, settings.slo, settings.fairness,
                                      token_facts(requests, flat), settings.qoe)


def write_results(run_dir, result: RunResult, settings: ResultSettings | None = None, extra: dict | None = None,
                  energy: dict | None = None) -> dict:
    """Write the three result files of `result` into `run_dir`; return the summary written.

    `settings`: the SLOs and fairness weights the metrics use and the config summary.json echoes
    (the app layer makes them from the run's config: `apps.config.result_settings`; defaults when
    None); `extra` entries are added to the summary. Each file is attempted even when an earlier
    one failed (a full disk may still take the small summary); the summary then lists the files
    that are missing, and the error names them all.
    """
    return ResultStream(run_dir, result.trace, settings).finish(result, extra, energy)


def _ms(x) -> str:
    return "—" if x is None else f"{x * 1e3:,.1f}"


def _num(x, fmt: str = ",.2f", suffix: str = "") -> str:
    return "—" if x is None else f"{x:{fmt}}{suffix}"


def energy_line(energy: dict) -> str:
    """Energy per output token, per request and per request meeting its SLOs, and the mean power."""
    clock = f" at {energy['gpu_clock_mhz']:,.0f} MHz" if energy.get("gpu_clock_mhz") else ""
    return (f"{_num(energy['per_output_token_j'], ',.4f')} J/out token, {_num(energy['per_request_j']['mean'], ',.1f')} "
            f"J/request, {_num(energy['per_good_request_j'], ',.1f')} J per request meeting its SLOs; "
            f"{_num(energy['mean_power_w'], ',.0f')} W mean per GPU ({energy['gpus']} GPUs{clock})")


def fairness_line(fair: dict, windows: dict) -> str:
    """Windowed Jain and service difference of the backlogged clients first, the whole run after."""
    whole = (f"whole run: Jain {_num(fair.get('jain_index'), '.3f')}, max service diff "
             f"{_num(fair.get('service_difference_max'), ',.0f')}")
    if not windows.get("contended_windows"):
        return f"no window had two clients backlogged throughout; {whole}"
    return (f"windowed Jain {_num(windows.get('jain_mean'), '.3f')} (worst {_num(windows.get('jain_min'), '.3f')}), "
            f"service diff {_num(windows.get('service_difference_mean'), ',.0f')} per "
            f"{_num(windows.get('window_s'), '.3g')} s window ({windows['contended_windows']} of "
            f"{windows.get('windows')} contended); {whole}")


def session_line(sessions: dict) -> str:
    """One line on a closed-loop replay: completions, session time, TTFT of the first turns."""
    done = sessions.get("completion_time") or {}
    turns = sessions.get("ttft_by_turn") or {}
    ttft = ", ".join(f"turn {k} {_ms((v or {}).get('p50'))}" for k, v in list(turns.items())[:4])
    return (f"{sessions['completed']} of {sessions['count']} completed, session time p50 "
            f"{_num(done.get('p50'), ',.2f')} s / p99 {_num(done.get('p99'), ',.2f')} s; TTFT p50 (ms) {ttft}. "
            f"{sessions['mode']}")
def program_line(p: dict) -> str:
    """Tool calls: job completion time, time paused, what became of the KV, tokens recomputed."""
    jct, paused = p.get("jct") or {}, p.get("tool_time") or {}
    return (f"{METRICS['programs.jct'].name} p50 {_num(jct.get('p50'), ',.3f')} s / p99 {_num(jct.get('p99'), ',.3f')} s "
            f"(tools' time included; TTFT, TPOT, ITL, E2E exclude it); paused p50 {_num(paused.get('p50'), ',.3f')} s; "
            f"{p.get('tool_calls', 0)} tool calls: KV kept {p.get('kept', 0)}, freed {p.get('freed', 0)}, "
            f"offloaded {p.get('offloaded', 0)}; {p.get('recomputed_tokens', 0)} tokens recomputed")


def print_summary(summary: dict, console: Console | None = None) -> None:
    """Compact end-of-run report: latency percentiles (ms), SLOs, throughput, rejections."""
    console = console or Console()
    if summary.get("partial"):
        console.print(Panel(f"PARTIAL RUN: {summary.get('error') or 'stopped early'}",
                            style="bold red"))
    latency = Table(title=f"policy {summary.get('policy', '?')}: latency (ms)", title_justify="left")
    for column in ("metric", "p50", "p90", "p99"):
        latency.add_column(column, justify="left" if column == "metric" else "right")
    for key in ("ttft", "tpot", "itl", "e2e"):
        stats = summary.get(key) or {}
        latency.add_row(METRICS[key].name, *(_ms(stats.get(q)) for q in ("p50", "p90", "p99")))
    counts, tput, fair = summary["counts"], summary["throughput"], summary.get("fairness", {})
    overview = Table(show_header=False, box=None)
    overview.add_column(style="bold")
    overview.add_column()
    overview.add_row("requests", f"{counts['finished']} finished, {counts['rejected']} rejected, "
                     f"{counts['unfinished']} unfinished of {counts['requests']}")
    attainment = summary.get("slo_attainment")
    overview.add_row(METRICS["slo_attainment"].name, _num(None if attainment is None else attainment * 100,
                                                          ".1f", " %"))
    overview.add_row(METRICS["goodput"].name, _num(summary.get("goodput"), ",.3f", " " + METRICS["goodput"].unit))
    overview.add_row("throughput", f"{_num(tput['output_tokens_per_s'], ',.1f')} out tok/s, "
                     f"{_num(tput['input_tokens_per_s'], ',.1f')} in tok/s, "
                     f"{_num(tput['requests_per_s'], ',.3f')} req/s")
    load = summary.get("load")
    if load:
        overview.add_row("offered load", f"{_num(load.get('fraction'), '.2f')} of an estimated capacity of "
                         f"{_num(load.get('capacity_rate'), ',.3f')} req/s (trace.rate_scale "
                         f"{_num(load.get('rate_scale'), '.4g')})")
    overview.add_row("preemptions", str(summary.get("preemptions", 0)))
    overview.add_row("prefix cache", f"{_num(100 * (summary.get('prefix_cache_hit_rate') or 0), '.1f')} % "
                     "of prompt tokens served from cached blocks")
    if (fair.get("num_clients") or 0) > 1:
        overview.add_row("fairness", fairness_line(fair, summary.get("fairness_windows") or {}))
    spec = summary.get("speculative")
    if spec:
        overview.add_row("speculation", f"{spec['proposed_tokens']} drafts, {_num(100 * spec['acceptance_rate'], '.1f')} "
                         f"% accepted, {_num(spec['tokens_per_step'], '.2f')} tokens per verifying step")
    programs = summary.get("programs")
    if programs:
        overview.add_row("programs", program_line(programs))
    cluster = summary.get("cluster")
    if cluster:
        busy = ", ".join(f"{_num(100 * (r.get('utilization') or 0), '.0f')} %" for r in cluster["replicas"].values())
        overview.add_row("cluster", f"{cluster['num_replicas']} replicas, router {summary.get('router')}: "
                         f"busy {busy}; load imbalance {_num(cluster.get('load_imbalance'), '.3f')}, "
                         f"goodput/GPU {_num(cluster.get('goodput_per_gpu'), ',.3f')} req/s")
    sessions = summary.get("sessions")
    if sessions:
        overview.add_row("sessions", session_line(sessions))
    energy = summary.get("energy")
    if energy:
        overview.add_row("energy", energy_line(energy))
    quality = summary.get("quality")
    if quality:
        overview.add_row("quality", f"greedy agreement {_num(100 * (quality['greedy_agreement'] or 0), '.2f')} % with "
                         f"full precision over {quality['positions']} positions, logit error "
                         f"{_num(quality['logit_rmse'], '.4f')} (rms, relative), KL {_num(quality['kl_divergence'], '.5f')}")
    console.print(latency)
    console.print(overview)
    rejections = summary.get("rejections") or []
    if rejections:
        console.print("[bold]rejected requests[/bold]")
        for r in rejections[:MAX_LISTED_REJECTIONS]:
            console.print(f"  #{r['req_id']} ({r['client']}): {r['reason']}", markup=False)
        more = counts["rejected"] - min(len(rejections), MAX_LISTED_REJECTIONS)
        if more > 0:
            console.print(f"  ... and {more} more")
