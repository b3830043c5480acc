"""`python -m policylab trace ...`: inspect, convert and generate arrival traces.

Examples:
  python -m policylab trace list
  python -m policylab trace download azure_code mooncake_synthetic
  python -m policylab trace inspect azure_code --plot azure.png
  python -m policylab trace convert mooncake_synthetic mc.parquet --max-requests 500
  python -m policylab trace generate --kind poisson -n 300 --rate 4 -o my.jsonl
  python -m policylab trace generate --kind sessions -n 40 --mean-turns 4 --think-time 3 -o chat.jsonl
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Optional

from policylab.apps.data_cli import add_commands
from policylab.datasets.cache import DatasetError
from policylab.traces.arrivals import ArrivalProcess
from policylab.traces.config import TraceConfig
from policylab.traces.errors import TraceError
from policylab.traces.formats import FORMATS
from policylab.traces.generate import ClientSpec, PrefixPool, generate_trace, multitenant_clients
from policylab.traces.lengths import LengthDist
from policylab.traces.load import load_trace
from policylab.traces.native import write_native
from policylab.traces.parquet import write_parquet
from policylab.traces.stats import format_stats, trace_stats

LENGTH_HELP = "fixed:N | uniform:LOW,HIGH | lognormal:mean=M,p90=V[,max=B] (any pNN)"


def _pairs(items, what: str) -> dict:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{what} takes KEY=VALUE, got '{item}'")
        out[key] = value
    return out


def _slo_class(text: str) -> tuple:
    """'interactive=0.5/0.05' -> ('interactive', 0.5, 0.05)."""
    name, _, slos = text.partition("=")
    try:
        ttft, tpot = (float(x) for x in slos.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"SLO class is NAME=TTFT/TPOT in seconds, got '{text}'") from None
    return name, ttft, tpot


def _add_transform_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("reading and transforms (the trace.* config keys)")
    g.add_argument("--format", default="auto", choices=FORMATS, help="file format (default: detect)")
    g.add_argument("--extra", action="append", metavar="KEY=VALUE",
                   help="reader option, e.g. BurstGPT: model=ChatGPT or log_type='Conversation log'")
    g.add_argument("--rate-scale", type=float, default=1.0, help=">1 compresses inter-arrival times")
    g.add_argument("--max-requests", type=int, help="keep the first N requests")
    g.add_argument("--start-time", type=float, help="window start (s from the first request)")
    g.add_argument("--end-time", type=float, help="window end (s, exclusive)")
    g.add_argument("--max-prompt-tokens", type=int, help="clip longer prompts")
    g.add_argument("--max-output-tokens", type=int, help="clip longer outputs")
    g.add_argument("--sample-fraction", type=float, help="keep each request with this probability")
    g.add_argument("--client-assignment", default="keep", choices=("keep", "column", "round_robin", "zipf"))
    g.add_argument("--client-column", help="column / key naming the client (with --client-assignment column)")
    g.add_argument("--num-clients", type=int, default=4, help="clients for round_robin / zipf")
    g.add_argument("--zipf-exponent", type=float, default=1.0)
    g.add_argument("--slo-class", action="append", type=_slo_class, metavar="NAME=TTFT/TPOT",
                   help="define an SLO class (seconds); interactive=0.5/0.05 and batch=5/0.5 exist")
    g.add_argument("--slo-by-client", action="append", metavar="CLIENT=CLASS")
    g.add_argument("--slo-ratio", action="append", metavar="CLASS=WEIGHT")
    g.add_argument("--prefix-block-tokens", type=int, default=512, help="tokens per prefix hash id")
    g.add_argument("--seed", type=int, default=0, help="seed of sampling / zipf / SLO-ratio draws")


def _config(a, path: str) -> TraceConfig:
    extra = {k: (v.split(",") if "," in v else v) for k, v in _pairs(a.extra, "--extra").items()}
    cfg = TraceConfig(
        name=Path(path).stem, path=path, format=a.format, rate_scale=a.rate_scale,
        max_requests=a.max_requests, start_time=a.start_time, end_time=a.end_time,
        max_prompt_tokens=a.max_prompt_tokens, max_output_tokens=a.max_output_tokens,
        prefix_block_tokens=a.prefix_block_tokens, extra=extra, sample_fraction=a.sample_fraction,
        client_assignment=a.client_assignment, client_column=a.client_column, num_clients=a.num_clients,
        zipf_exponent=a.zipf_exponent, slo_by_client=_pairs(a.slo_by_client, "--slo-by-client"),
        slo_ratio={k: float(v) for k, v in _pairs(a.slo_ratio, "--slo-ratio").items()})
    cfg.slo_classes.update({n: {"ttft_slo": t, "tpot_slo": p} for n, t, p in a.slo_class or []})
    return cfg


def _write(path: str, reqs: list) -> int:
    if path.endswith((".parquet", ".pq")):
        return write_parquet(path, reqs)
    if path.endswith((".jsonl", ".jsonl.gz")):
        return write_native(path, reqs)
    raise ValueError(f"output '{path}' must end in .jsonl, .jsonl.gz or .parquet")


def cmd_inspect(a) -> int:
    reqs = load_trace(_config(a, a.file), a.seed)
    print(reqs.report.summary())
    if reqs.sessions is not None:
        plan = reqs.sessions
        print(f"sessions        {len(plan.firsts)} ({len(plan.trace) / len(plan.firsts):.2f} turns each); "
              "below, every turn at its session's start, with the prompt it has if each answer is complete")
    print(format_stats(trace_stats(reqs, a.prefix_block_tokens), a.prefix_block_tokens))
    if a.plot:
        from policylab.analysis.trace_plot import plot_trace
        print(f"plot            {plot_trace(reqs, a.plot, title=a.file)}")
    return 0


def cmd_convert(a) -> int:
    reqs = load_trace(_config(a, a.input), a.seed)
    if reqs.sessions is not None:
        raise ValueError(f"{a.input} is a session trace (docs/sessions.md): its turns arrive as earlier ones "
                         "finish, which an open-loop file cannot hold; replay it as it is")
    n = _write(a.output, reqs)
    print(f"{reqs.report.summary()}\nwrote {n} requests to {a.output}")
    return 0


def cmd_generate(a) -> int:
    prompt, output = LengthDist.parse(a.prompt_len), LengthDist.parse(a.output_len)
    prefix = PrefixPool(a.prefix_pool, a.prefix_blocks, a.prefix_share, a.prefix_block_tokens) \
        if a.prefix_pool else None
    if a.kind == "sessions":
        return _generate_sessions(a, prompt, output, prefix)
    if a.kind == "multitenant":
        clients = multitenant_clients(a.clients, a.rate, a.flood_factor, a.slo_class or (),
                                      a.client_names.split(",") if a.client_names else (),
                                      a.cv, prompt, output, prefix)
    else:
        arrivals = ArrivalProcess("gamma" if a.kind == "gamma" else a.kind, rate=a.rate, cv=a.cv,
                                  on_rate=a.on_rate, off_rate=a.off_rate,
                                  on_duration=a.on_duration, off_duration=a.off_duration)
        ttft, tpot = (a.slo_class[0][1:] if a.slo_class else (None, None))
        clients = [ClientSpec("default", arrivals, prompt, output, ttft, tpot, prefix=prefix)]
    reqs = generate_trace(clients, a.num_requests, a.seed)
    print(f"wrote {_write(a.output, reqs)} requests to {a.output} "
          f"({reqs[-1].arrival_time:.1f} s, seed {a.seed})")
    return 0


def _generate_sessions(a, prompt, output, prefix) -> int:
    """`--kind sessions`: a session trace (docs/sessions.md), -n sessions."""
    from policylab.traces.session_generate import SessionSpec, generate_sessions
    from policylab.traces.sessions import write_sessions
    if not a.output.endswith(".jsonl"):
        raise ValueError(f"a session trace is written as JSON lines: give -o OUT.jsonl, got {a.output}")
    arrivals = ArrivalProcess("gamma" if a.cv != 1 else "poisson", rate=a.rate, cv=a.cv)
    spec = SessionSpec(arrivals, a.mean_turns, a.max_turns, a.think_time, prompt, LengthDist.parse(a.follow_up_len),
                       output, prefix)
    sessions = generate_sessions(spec, a.num_requests, a.seed)
    turns = write_sessions(a.output, sessions)
    print(f"wrote {len(sessions)} sessions ({turns} turns) to {a.output} "
          f"(starts over {sessions[-1].start:.1f} s, seed {a.seed})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m policylab trace", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="{inspect,convert,generate,download,list}")
    i = sub.add_parser("inspect", help="print a trace's statistics (and plot it)",
                       description="Rate, burstiness (CV), length percentiles, prefix sharing, clients.")
    i.add_argument("file", help="trace file (native .jsonl, Azure/BurstGPT/Vidur .csv, Mooncake .jsonl, .parquet)")
    i.add_argument("--plot", metavar="OUT.png", help="also write arrival rate + length histograms")
    _add_transform_flags(i)
    i.set_defaults(run=cmd_inspect)
    c = sub.add_parser("convert", help="rewrite a trace as native .jsonl or .parquet (transforms applied)")
    c.add_argument("input")
    c.add_argument("output", help="OUT.jsonl, OUT.jsonl.gz or OUT.parquet")
    _add_transform_flags(c)
    c.set_defaults(run=cmd_convert)
    g = sub.add_parser("generate", help="write a synthetic trace (seeded)",
                       description="Synthetic trace from an arrival process and length distributions. "
                                   f"Length specs: {LENGTH_HELP}.")
    g.add_argument("--kind", required=True, choices=("poisson", "gamma", "bursty", "multitenant", "sessions"))
    g.add_argument("-n", "--num-requests", type=int, default=300, help="requests (sessions: sessions)")
    g.add_argument("-o", "--output", required=True, help="OUT.jsonl, OUT.jsonl.gz or OUT.parquet")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--rate", type=float, default=4.0, help="req/s (poisson, gamma; per client: multitenant)")
    g.add_argument("--cv", type=float, default=1.0, help="inter-arrival CV: gamma burstiness (1 = Poisson)")
    g.add_argument("--on-rate", type=float, default=20.0, help="bursty: req/s in a burst")
    g.add_argument("--off-rate", type=float, default=1.0, help="bursty: req/s between bursts")
    g.add_argument("--on-duration", type=float, default=2.0, help="bursty: mean burst length (s)")
    g.add_argument("--off-duration", type=float, default=8.0, help="bursty: mean quiet length (s)")
    g.add_argument("--prompt-len", default="lognormal:mean=256,p90=512", help=LENGTH_HELP)
    g.add_argument("--output-len", default="lognormal:mean=64,p90=128", help=LENGTH_HELP)
    g.add_argument("--clients", type=int, default=4, help="multitenant: number of clients")
    g.add_argument("--flood-factor", type=float, default=4.0,
                   help="multitenant: the first client ('flooder') sends this many times --rate (1: none)")
    g.add_argument("--client-names", help="multitenant: comma-separated names, first = the flooder")
    g.add_argument("--slo-class", action="append", type=_slo_class, metavar="NAME=TTFT/TPOT",
                   help="SLO class in seconds; multitenant deals them round-robin over clients")
    g.add_argument("--prefix-pool", type=int, default=0, help="system prompts per client (0: no sharing)")
    g.add_argument("--prefix-blocks", type=int, default=2, help="blocks per system prompt")
    g.add_argument("--prefix-share", type=float, default=0.8, help="share of requests with a system prompt")
    g.add_argument("--prefix-block-tokens", type=int, default=64,
                   help="tokens per block; replay with trace.prefix_block_tokens equal to it")
    g.add_argument("--mean-turns", type=float, default=4.0, help="sessions: mean turns a session (geometric)")
    g.add_argument("--max-turns", type=int, default=32, help="sessions: most turns a session")
    g.add_argument("--think-time", type=float, default=5.0, help="sessions: mean think time between turns (s)")
    g.add_argument("--follow-up-len", default="lognormal:mean=64,p90=128",
                   help="sessions: new tokens of each later turn (--prompt-len: the first turn's)")
    g.set_defaults(run=cmd_generate)
    add_commands(sub, "trace")
    return p


def main(argv: Optional[list] = None) -> int:
    args = build_parser().parse_args(argv)
    log = logging.getLogger("policylab.traces")
    level, log.level = log.level, logging.ERROR   # the commands print the load report themselves
    try:
        return args.run(args)
    except (TraceError, DatasetError, ValueError) as e:   # bad input: one clear line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:                 # `... | head`: the reader left, nothing is wrong
        sys.stdout = open(os.devnull, "w")
        return 0
    finally:
        log.setLevel(level)


if __name__ == "__main__":
    sys.exit(main())
