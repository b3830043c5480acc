"""Research check of speculative decoding on the sim: TPOT and goodput against k and load.

vLLM v1's scheduler with a fixed k (speculative.k = 0, 1, 2, 4) against spec_adaptive (the same
scheduler, k sized to the load), on the shipped Poisson trace (300 requests) at a low and a high
arrival rate, Llama-3-8B on an H100 (roofline, engine.max_num_seqs=256), n-gram drafts at
acceptance alpha (default 0.7), several replicates (block-bootstrap resamples of the trace with
their own acceptance draws: trace.replicate = seed). Goodput counts a TPOT SLO of 25 ms. Prints
mean ± 95 % CI (Student t over replicates) per configuration and load.

    python experiments/spec_decode_check.py [--replicates 3] [--low 1] [--high 80] [--alpha 0.7]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import logging
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

T95 = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 8: 2.36, 10: 2.26}
CONFIGS = {"k=0": ("vllm_v1", 0), "k=1": ("vllm_v1", 1), "k=2": ("vllm_v1", 2), "k=4": ("vllm_v1", 4),
           "adaptive": ("spec_adaptive", 0)}


def one(policy: str, k: int, rate_scale: float, replicate: int, args, root: Path) -> dict:
    from policylab import replay
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):   # (each
        # replay's own summary table and light-load warning)
        run = replay(policy, "poisson", f"trace.rate_scale={rate_scale}", f"trace.replicate={replicate}",
                     f"trace.max_requests={args.requests}", f"speculative.k={k}",
                     f"speculative.acceptance_rate={args.alpha}", f"slo.tpot={args.slo_tpot}",
                     f"engine.max_num_seqs={args.max_num_seqs}", dir=root / f"{policy}-{k}-{rate_scale}-{replicate}", dataplane="sim",
                     logger="none", plots=False, progress=False, seed=replicate)
    s = run.summary
    spec = s.get("speculative") or {}
    return {"TPOT mean (ms)": 1e3 * s["tpot"]["mean"], "TPOT p99 (ms)": 1e3 * s["tpot"]["p99"],
            "goodput (req/s)": s["goodput"], "TTFT p99 (ms)": 1e3 * s["ttft"]["p99"],
            "tokens/step": spec.get("tokens_per_step", 1.0), "acceptance": spec.get("acceptance_rate", 0.0)}


def mean_ci(values: list) -> str:
    m = statistics.fmean(values)
    if len(values) < 2:
        return f"{m:.3g}"
    half = T95.get(len(values), 2.0) * statistics.stdev(values) / len(values) ** 0.5
    return f"{m:.3g} ± {half:.2g}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicates", type=int, default=3)
    ap.add_argument("--low", type=float, default=1.0, help="rate_scale of the low load (x 4 req/s)")
    ap.add_argument("--high", type=float, default=80.0, help="rate_scale of the high load")
    ap.add_argument("--alpha", type=float, default=0.7, help="per-draft acceptance rate")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--slo-tpot", type=float, default=0.025, help="TPOT SLO (s) goodput counts against")
    args = ap.parse_args(argv)
    logging.disable(logging.INFO)
    with tempfile.TemporaryDirectory() as tmp:
        for label, scale in (("low", args.low), ("high", args.high)):
            print(f"\nload {label}: rate_scale {scale} (~{4 * scale:g} req/s), {args.replicates} replicates, "
                  f"TPOT SLO {args.slo_tpot * 1e3:g} ms, alpha {args.alpha}")
            rows = {}
            for name, (policy, k) in CONFIGS.items():
                runs = [one(policy, k, scale, r, args, Path(tmp))
                        for r in range(1, args.replicates + 1)]
                rows[name] = {m: mean_ci([r[m] for r in runs]) for m in runs[0]}
            metrics = list(next(iter(rows.values())))
            print(f"{'config':<10}" + "".join(f"{m:>20}" for m in metrics))
            for name, row in rows.items():
                print(f"{name:<10}" + "".join(f"{row[m]:>20}" for m in metrics))


if __name__ == "__main__":
    main()
