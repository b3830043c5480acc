"""Research check of copy-on-write forks, through the `run` job users start (not a test; the
numbers go in docs/forks.md).

Under KV pressure (the sim plane, Llama-3-8B shape on an H100, a small KV cache), the same work
of `--samples` samples per prompt is served three ways:
  forks       — one request with `n` samples: the prompt is prefilled once, its blocks shared by
                reference count, the block each sample writes copied on write;
  fan-out+pc  — `n` independent requests of the same prompt (equal prefix_hashes): the prefix
                cache shares the prompt's full blocks once one of them has computed them;
  fan-out     — `n` independent requests, each prompt its own: nothing shared.
Reported: peak KV blocks with a cache too large to fill (`--ample` blocks: what each way needs),
then under pressure (`--blocks`): peak and mean KV blocks used, output tokens of every sample per second, preemptions
(of every sample), prompt tokens computed, TTFT p50/p99 of the requests (forks: the request's
first token; fan-out: each copy's own).
Usage: python experiments/forks_check.py [--requests 150] [--samples 4] [--rate 4] [--blocks 1200] [--out DIR]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # this checkout's policylab and policies
from policylab.apps.cli import main  # noqa: E402


def write_traces(out: Path, requests: int, samples: int, rate: float, seed: int = 0) -> dict:
    rng, t = random.Random(seed), 0.0
    rows = []
    for i in range(requests):
        t += rng.expovariate(rate)
        prompt = rng.randint(256, 1536)
        outputs = [rng.randint(32, 384) for _ in range(samples)]
        rows.append((round(t, 6), prompt, outputs, i))
    files = {name: out / f"{name}.jsonl" for name in ("forks", "fan-out+pc", "fan-out")}
    with files["forks"].open("w") as f:
        for t, prompt, outputs, _ in rows:
            f.write(json.dumps({"arrival_time": t, "prompt_tokens": prompt, "output_tokens": outputs[0],
                                "n": samples, "fork_output_tokens": outputs[1:]}) + "\n")
    for name, shared in (("fan-out+pc", True), ("fan-out", False)):
        with files[name].open("w") as f:
            for t, prompt, outputs, i in rows:
                for k, o in enumerate(outputs):
                    rec = {"arrival_time": t, "prompt_tokens": prompt, "output_tokens": o}
                    if shared:       # one id per 512 tokens: the same ids, the same prompt
                        rec["prefix_hashes"] = [f"p{i}-{j}" for j in range(-(-prompt // 512))]
                    f.write(json.dumps(rec) + "\n")
    return files


def run(trace: Path, out: Path, name: str, blocks: int) -> dict:
    args = ["run", "trace=file", f"trace.path={trace}", "model=llama3-8b", "hardware=h100", "dataplane=sim",
            "policy=chunked", f"engine.num_blocks={blocks}", "logger=none", "plots=false", "progress=false",
            f"hydra.run.dir={out / name}"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main(args)
    return json.loads((out / name / "summary.json").read_text())


def main_check() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--blocks", type=int, default=1200, help="engine.num_blocks (16 tokens each)")
    ap.add_argument("--ample", type=int, default=40000, help="engine.num_blocks of the run without pressure")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="forks_check_"))
    out.mkdir(parents=True, exist_ok=True)
    files = write_traces(out, a.requests, a.samples, a.rate)
    print(f"{a.requests} prompts x {a.samples} samples, {a.rate}/s, {a.blocks} KV blocks; runs in {out}")
    print(f"| serving | peak KV blocks needed ({a.ample} free) | peak KV blocks | mean KV blocks | output tok/s (all samples) | preemptions "
          "| prompt tokens computed | TTFT p50 (ms) | TTFT p99 (ms) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, path in files.items():
        ample = run(path, out, name + "-ample", a.ample)["kv_utilization"]["max"] * a.ample
        s = run(path, out, name, a.blocks)
        forks = s.get("forks") or {}
        tput = forks.get("all_samples_output_tokens_per_s") or s["throughput"]["output_tokens_per_s"]
        prefill = _prefill_tokens(out / name)
        kv = s["kv_utilization"]
        print(f"| {name} | {ample:,.0f} | {kv['max'] * a.blocks:,.0f} | {kv['mean'] * a.blocks:,.0f} | {tput:,.0f} "
              f"| {s['preemptions'] + forks.get('fork_preemptions', 0)} | {prefill:,} "
              f"| {1000 * s['ttft']['p50']:,.0f} | {1000 * s['ttft']['p99']:,.0f} |")


def _prefill_tokens(run_dir: Path) -> int:
    """Prompt tokens the engine computed (the step table's prefill_tokens column)."""
    import pandas as pd
    for name in ("steps.parquet", "steps.csv", "steps.csv.gz"):
        if (run_dir / name).exists():
            df = pd.read_parquet(run_dir / name) if name.endswith("parquet") else pd.read_csv(run_dir / name)
            return int(df["prefill_tokens"].sum())
    return -1


if __name__ == "__main__":
    main_check()
