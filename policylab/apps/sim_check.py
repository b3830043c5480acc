"""`python -m policylab sim-check FILE.csv`: your own step-time measurements against the sim's cost model.

FILE.csv is tidy, one measurement a row (lines starting with # are comments):

    model,gpu,tp,dtype,phase,batch,tokens_per_request,context,measured_ms

- model, gpu: names of configs/model/ and configs/hardware/ (llama3-8b, h100, ...), or the names the
  model and the GPU go by where they spell one ("meta-llama/Llama-2-70b-hf", "H100-80GB");
- tp: tensor-parallel GPUs; dtype: bf16 | fp16 | fp8 (bytes per weight and KV element);
- phase: `decode` (a whole step of `batch` requests decoding one token each after `context`
  tokens), `prefill` (a whole step of `batch` chunks of `tokens_per_request` tokens after
  `context` cached ones), `mixed` (a whole step of `batch` decodes after `context` tokens and one
  prefill chunk of `tokens_per_request` fresh tokens, as a chunked-prefill engine runs them),
  `dense` (kernel time of all layers' GEMMs and elementwise ops plus the embedding for batch x
  tokens_per_request tokens: what a Vidur mlp.csv measures) or `attention` (one layer's
  attention kernel for that batch);
- measured_ms: the measured time in milliseconds.

Read by the one CSV reader (policylab.traces.csv_table): a bad cell is refused naming its line
and column and the range it must be in (`INTEGER_RANGES`, `MAX_MS`).

Whole steps (decode, prefill, mixed) are priced inside the serving engine `--serving-engine`
names (configs/serving_engine/: its host time, all-reduce implementation, CUDA graphs and kernel
choices; default `none`: kernel time only, as a profiler of single kernels measures them on a
current library; `vidur`: the same on the library of Vidur's profiles). Pass the engine that
produced your measurements: `vllm` for recent vLLM, `eager_nccl` for an eager engine.

Printed: per phase (and per tensor-parallel size where several appear) the points, MAPE, bias
(mean signed error) and the worst point, error being predicted / measured - 1; `--plot PATH`
writes predicted against measured. `--sample` checks the shipped public sample (Vidur's A100
Llama-3-8B kernel times).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from difflib import get_close_matches
from importlib.resources import files
from pathlib import Path

from omegaconf import OmegaConf

from policylab.apps.config import CONFIG_DIR, presets
from policylab.core.config import HardwareConfig, ModelConfig
from policylab.core.request import MAX_ARRIVAL_S
from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane.serving_engine import ServingEngineConfig
from policylab.traces.csv_table import cell_value, csv_rows
from policylab.traces.errors import TraceError, shown

COLUMNS = ("model", "gpu", "tp", "dtype", "phase", "batch", "tokens_per_request", "context", "measured_ms")
PHASES = ("decode", "prefill", "mixed", "dense", "attention")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "float16": 2, "bfloat16": 2, "fp8": 1}


# (column, least, most): past these a row is a unit slip, not a measurement (a batch of 1e12 would
# build its sequence lists for minutes; the longest published context windows hold 10M tokens)
INTEGER_RANGES = (("tp", 1, 1024), ("batch", 1, 1 << 16), ("tokens_per_request", 0, 1 << 24),
                  ("context", 0, 1 << 24))
MAX_MS = MAX_ARRIVAL_S * 1e3     # a step time, as every time field, within what an arrival may be


class CheckError(ValueError):
    pass


def sample_path() -> Path:
    checkout = Path(__file__).resolve().parents[2] / "traces" / "sim_check_sample.csv"
    return checkout if checkout.is_file() else Path(str(files("policylab.shipped_traces") / "sim_check_sample.csv"))


def read_rows(path: Path) -> list:
    """The CSV's rows as dicts of typed values (the one CSV reader: policylab.traces.csv_table);
    a bad cell names its line and column and the range expected."""
    name = str(path)
    rows = []
    for line, raw in csv_rows(path, name, COLUMNS, comments=True, exact=True, expected="a CSV of measurements"):
        row = {key: int(cell_value(raw[key], name, line, key, low, high, integer=True))
               for key, low, high in INTEGER_RANGES}
        row["measured_ms"] = cell_value(raw["measured_ms"], name, line, "measured_ms", 0, MAX_MS, above=True,
                                        unit="ms")
        phase, dtype = raw["phase"].lower(), raw["dtype"].lower()
        if phase not in PHASES:
            raise TraceError(name, line, "phase", f"expected one of {', '.join(PHASES)}, got {shown(raw['phase'])}",
                             kind="column")
        if dtype not in DTYPE_BYTES:
            raise TraceError(name, line, "dtype", f"expected one of {', '.join(DTYPE_BYTES)}, got "
                             f"{shown(raw['dtype'])}", kind="column")
        if phase != "decode" and row["tokens_per_request"] < 1:
            raise TraceError(name, line, "tokens_per_request", f"expected >= 1 for phase {phase}, got 0",
                             kind="column")
        rows.append({**row, "model": named_preset("model", raw["model"], name, line),
                     "gpu": named_preset("gpu", raw["gpu"], name, line), "phase": phase,
                     "dtype_bytes": DTYPE_BYTES[dtype], "line": line})
    return rows


def named_preset(column: str, text: str, file: str, line: int) -> str:
    """The preset a row's `model` or `gpu` cell names: a preset's own name, or the one the model's or
    GPU's name spells (policylab.apps.served_names: "Llama-2-70B", "H100-80GB"); else a TraceError at
    the row."""
    from policylab.apps.served_names import gpu_preset, model_preset
    try:
        if column == "gpu":
            return gpu_preset(text)
        known = presets("model")
        preset = text if text in known else model_preset(text)
        if preset is None:
            close = get_close_matches(text, known, n=1)
            raise ValueError(f"{shown(text)} names no configs/model preset"
                             + (f" (did you mean {close[0]}?)" if close else "") + f"; one of {', '.join(known)}")
        return preset
    except ValueError as e:
        raise TraceError(file, line, column, str(e), kind="column") from None


def load_group(group: str, name: str, schema):
    path = Path(CONFIG_DIR) / group / f"{name}.yaml"
    if not path.is_file():
        known = presets(group)
        close = get_close_matches(name, known, n=1)
        raise CheckError(f"no configs/{group}/{name}.yaml" + (f" (did you mean {close[0]}?)" if close else "")
                         + f"; known: {', '.join(known)}")
    node = OmegaConf.load(path)
    for parent in [d for d in node.pop("defaults", []) if d != "_self_"]:     # a preset built on another
        node = OmegaConf.merge(OmegaConf.structured(load_group(group, parent, schema)), node)
    node = OmegaConf.merge(OmegaConf.structured(schema), node)
    return OmegaConf.to_object(node)


def predict(row: dict, cost_model: str, engine: str | None, cache: dict) -> float:
    """The cost model's time (ms) of the row's batch (whole steps inside the serving engine `engine`)."""
    from policylab.dataplane.sim import build_cost_model
    key = (row["model"], row["gpu"], row["tp"], row["dtype_bytes"])
    model = cache.get(key)
    if model is None:
        m = replace(load_group("model", row["model"], ModelConfig), dtype_bytes=row["dtype_bytes"])
        hw = load_group("hardware", row["gpu"], HardwareConfig)
        preset = load_group("serving_engine", engine, ServingEngineConfig) if engine else None
        model = cache[key] = build_cost_model(m, hw, DataplaneConfig(kind="sim", tensor_parallel=row["tp"],
                                                                     cost_model=cost_model, serving_engine=preset))
    b, n, c = row["batch"], max(1, row["tokens_per_request"]), row["context"]
    phase = row["phase"]
    if phase == "decode":
        return 1e3 * model.step_time([1] * b, [c] * b, b, b)
    if phase == "prefill":
        return 1e3 * model.step_time([n] * b, [c] * b, n * b, b)
    if phase == "mixed":
        return 1e3 * model.step_time([1] * b + [n], [c] * b + [0], b + n, b + 1)
    if phase == "dense":
        return 1e3 * model.dense_time(n * b)
    q = [1] * b if row["tokens_per_request"] <= 1 else [n] * b
    return 1e3 * model.attention_time(q, [c] * b, sum(q)) / model.shape.layers


def summarize(rows: list, predicted: list) -> list:
    """(phase, points, MAPE, bias, worst error, worst line) per phase present (and per phase and TP
    when a phase has several TP sizes), then all."""
    groups = []
    for phase in [p for p in PHASES if any(r["phase"] == p for r in rows)]:
        groups.append((phase, lambda r, phase=phase: r["phase"] == phase))
        tps = sorted({r["tp"] for r in rows if r["phase"] == phase})
        if len(tps) > 1:
            groups += [(f"{phase} TP {tp}", lambda r, phase=phase, tp=tp: r["phase"] == phase and r["tp"] == tp)
                       for tp in tps]
    out = []
    for label, keep in groups + [("all", lambda r: True)]:
        errs = [(p / r["measured_ms"] - 1, r["line"]) for r, p in zip(rows, predicted) if keep(r)]
        worst = max(errs, key=lambda e: abs(e[0]))
        out.append((label, len(errs), sum(abs(e) for e, _ in errs) / len(errs), sum(e for e, _ in errs) / len(errs),
                    worst[0], worst[1]))
    return out


def plot(rows: list, predicted: list, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 5))
    for phase in PHASES:
        pts = [(r["measured_ms"], p) for r, p in zip(rows, predicted) if r["phase"] == phase]
        if pts:
            ax.scatter(*zip(*pts), s=12, label=phase)
    lo = min(min(r["measured_ms"] for r in rows), min(predicted))
    hi = max(max(r["measured_ms"] for r in rows), max(predicted))
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="measured (ms)", ylabel="predicted (ms)", title="sim-check")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m policylab sim-check", description=__doc__.split("\n")[0])
    ap.add_argument("file", nargs="?", type=Path, help="tidy CSV of measurements (see the module doc)")
    ap.add_argument("--sample", action="store_true", help="check the shipped public sample instead")
    ap.add_argument("--cost-model", choices=("shaped", "roofline", "kernel"), default="shaped",
                    help="shaped (the simulator's default), roofline or kernel")
    ap.add_argument("--serving-engine", default=None,
                    help="a configs/serving_engine/ preset the measured steps ran in (vllm, vllm_eager, eager_nccl; "
                         "default: none, kernel time only on a current library; vidur: on the library of "
                         "Vidur's profiles, H100 GEMMs in waves)")
    ap.add_argument("--plot", type=Path, default=None, help="write predicted vs measured to this PNG")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    path = sample_path() if args.sample else args.file
    if path is None:
        print("error: give FILE.csv or --sample", file=sys.stderr)
        return 2
    try:
        rows = read_rows(path)
        cache: dict = {}
        predicted = [predict(r, args.cost_model, args.serving_engine, cache) for r in rows]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{path}: {len(rows)} points, cost_model={args.cost_model}, serving_engine={args.serving_engine or 'none'}\n")
    print("| phase | points | MAPE | bias | worst (line) |\n|---|---|---|---|---|")
    for phase, n, mape, bias, worst, line in summarize(rows, predicted):
        print(f"| {phase} | {n} | {mape * 100:.1f} % | {bias * 100:+.1f} % | {worst * 100:+.1f} % ({line}) |")
    if args.plot:
        plot(rows, predicted, args.plot)
        print(f"\nplot: {args.plot}")
    return 0
