"""The energy model against the ML.ENERGY benchmark's measured vLLM energy per output token.

Each published configuration (experiments/mlenergy_data.py: model, GPU, tensor parallelism,
max_num_seqs) is replayed on the sim as the benchmark ran it: every request sent at once,
max_num_seqs of them running (vLLM v1's chunked scheduling: decodes first, 8,192 tokens a step),
output lengths exponential around the published mean, prompt lengths log-normal around
`--prompt-mean` tokens (the LMArena prompts' lengths are not published; 250 tokens is what
makes the KV-bound batch of the one KV-bound Llama-3.1-8B configuration, 691 of max_num_seqs
768, come out on the sim), in the `vllm` serving engine (configs/serving_engine/vllm.yaml: async
scheduling, CUDA graphs, vLLM's kernels and memory, as vLLM 0.11.1 ran them). Over the steady state (requests still waiting, after the first
wave's prefill) the sim's energy per output token, power and throughput are compared with the
measured ones: error = predicted / measured - 1.

    python experiments/check_energy_mlenergy.py                  # every configuration, errors by model/GPU pair
    python experiments/check_energy_mlenergy.py --fit h100       # fit active/compute power on Llama-3.1-8B
    python experiments/check_energy_mlenergy.py --fit b200       # fit active/compute power on Qwen3-32B
    python experiments/check_energy_mlenergy.py --models llama-3.1-8b --gpus h100
    python experiments/check_energy_mlenergy.py --v2-a100        # the A100 rows of benchmark v2.0 (vLLM 0.5.4)
    python experiments/check_energy_mlenergy.py --fit-host b200  # fit the testbed's host time on Llama-3.1-8B
    python experiments/check_energy_mlenergy.py --host none      # without the testbed's host time (kernels + vllm engine)

Every replay runs on the benchmark's host (`--host`, default configs/host/mlenergy_v3.yaml: the
host work of vLLM 0.11.1 and its OpenAI server on the ML.ENERGY testbed, per step and per running
request, hidden behind the GPU under async scheduling unless it is longer), the same on both GPUs.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlenergy_data import MLENERGY_V2_A100, MLENERGY_V3, SHAPES  # noqa: E402
from policies.chunked import Chunked  # noqa: E402
from policylab.apps.sim_check import load_group  # noqa: E402
from policylab.core.config import EngineConfig, HardwareConfig  # noqa: E402
from policylab.core.engine import Engine  # noqa: E402
from policylab.core.request import TraceRequest  # noqa: E402
from policylab.dataplane.config import DataplaneConfig  # noqa: E402
from policylab.dataplane.energy import PowerModel  # noqa: E402
from policylab.dataplane.sim import SimDataPlane  # noqa: E402

FIT_MODEL = "llama-3.1-8b"        # the host time's fit pair (on the B200)
# each GPU's power fit pair: on the H100 Llama-3.1-8B; on the B200 Qwen3-32B, the one model the B200 keeps
# busy at every batch size (its kernels fill the step), so the fit sees the kernels' power, not the host's waits
POWER_FIT = {"h100": "llama-3.1-8b", "b200": "qwen3-32b"}
MAX_OUTPUT = 4096
HOST = "mlenergy_v3"
HOST_V2 = "mlenergy_v2"
HOST_KEYS = ("step_overhead", "host_per_request", "host_per_token")
# (model, GPU) pairs whose experts vLLM 0.11.1 ran on its default fused-MoE tiles, having no tuned file for them:
# Qwen3-30B-A3B at TP 1 on the B200 (configs/E=128,N=768,device_name=NVIDIA_B200.json came with vLLM PR #31448,
# December 2025, after 0.11.1). The H100 pair stays on tuned tiles: vLLM's configs directory has an H100 file for that
# shape (from its Qwen3-MoE configurations, PR #17328, April 2025, as far as checked), and the pair fits as it is.
UNTUNED_FUSED_MOE = {("qwen3-30b-a3b", "b200")}


def on_host(hw: HardwareConfig, host: str) -> HardwareConfig:
    """`hw` with configs/host/HOST.yaml's host time (as `host=HOST` composes it; `none`: kernel time only)."""
    from omegaconf import OmegaConf
    from policylab.apps.config import CONFIG_DIR
    node = OmegaConf.to_container(OmegaConf.load(Path(CONFIG_DIR) / "host" / f"{host}.yaml"))
    return host_timed(hw, node.get("host"), *(float(node.get(k, 0.0)) for k in HOST_KEYS))


def host_timed(hw: HardwareConfig, name, per_step: float, per_request: float, per_token: float = 0.0):
    """`hw` on a host of `per_step` + `per_request` x running requests + `per_token` x tokens seconds a step."""
    return replace(hw, host=name, step_overhead=per_step, host_per_request=per_request, host_per_token=per_token)


def workload(batch: int, out_mean: float, prompt_mean: float, seed: int = 0) -> list:
    """All requests at t = 0: enough for a steady state of about two waves after the first."""
    rng = np.random.default_rng(seed)
    n = 3 * batch + 200
    sigma = 1.0
    prompts = np.clip(rng.lognormal(np.log(prompt_mean) - sigma ** 2 / 2, sigma, n), 4, 8192).astype(int)
    outputs = np.clip(rng.exponential(out_mean, n), 2, MAX_OUTPUT).astype(int)
    return [TraceRequest(0.0, int(p), int(o)) for p, o in zip(prompts, outputs)]


def serving_engine(name: str, **overrides):
    """configs/serving_engine/NAME.yaml as the config the sim plane takes (`serving_engine=NAME`), with `overrides`."""
    from omegaconf import OmegaConf
    from policylab.apps.config import CONFIG_DIR
    from policylab.dataplane.serving_engine import ServingEngineConfig
    node = OmegaConf.to_container(OmegaConf.load(Path(CONFIG_DIR) / "serving_engine" / f"{name}.yaml"))
    return ServingEngineConfig(**{**node, **overrides})


def replay(model: str, gpu: str, tp: int, batch: int, out_mean: float, prompt_mean: float, hw: HardwareConfig,
           engine: str = "vllm", power_limit: str = "cap", overlap_norm: float | None = None):
    """Steady-state arrays of the replay: per step (duration, u_compute, u_memory, sampled tokens, busy share),
    and the running count. `overlap_norm`: the engine's serving_engine.async_overlap_norm (None: the preset's)."""
    power_limit = power_limit if hw.max_clock_mhz else "cap"   # (throttling needs the GPU's clock: not the B200's)
    overrides = {"fused_moe_config": "default"} if (model, gpu) in UNTUNED_FUSED_MOE else {}
    if overlap_norm is not None:
        overrides["async_overlap_norm"] = overlap_norm
    plane = SimDataPlane(SHAPES[model], hw, DataplaneConfig(kind="sim", tensor_parallel=tp, power_limit=power_limit,
                                                            serving_engine=serving_engine(engine, **overrides)), seed=0)
    plane.meter.record = []
    engine = Engine(workload(batch, out_mean, prompt_mean), Chunked(chunk_size=8192), plane,
                    EngineConfig(max_num_seqs=batch, max_num_batched_tokens=max(8192, batch),
                                 max_model_len=32768), seed=0)
    result = engine.run()
    steps = np.array(plane.meter.record)
    waiting, running = result.steps["waiting"], result.steps["running"]
    first = int(np.argmax(running >= min(batch, running.max())))      # the first wave admitted
    settled = first + int(np.argmax(result.steps["decode_tokens"][first:] >= 0.9 * running[first:]))
    window = np.arange(len(steps)) >= settled
    window &= waiting > 0
    if window.sum() < 20:                                             # (a tiny run: all of it)
        window = np.ones(len(steps), dtype=bool)
    return steps[window], running[window]


def predicted(steps: np.ndarray, pm: PowerModel, gpus: int, measured_tput: float | None = None,
              exponent: float = 1.0) -> tuple:
    """(J per output token, mean power over the GPUs W, output tokens/s) of the steady state, each step
    at the clock it ran at (power_limit=throttle lowers it at the board limit). With `measured_tput`,
    every step stretched or shrunk so the throughput is the measured one (its work, hence its
    utilisations, unchanged in total): the power model alone, without the time model's error."""
    t, uc, um, sampled, busy, ratio = steps.T
    if measured_tput is not None:
        stretch = (sampled.sum() / t.sum()) / measured_tput
        t, uc, um = t * stretch, uc / stretch, um / stretch
        busy = 1 - (1 - busy) / stretch                 # the waiting seconds stay as they were
    power = step_power(pm, uc, um, busy, ratio ** exponent) * gpus
    energy = (power * t).sum()
    return energy / sampled.sum(), energy / t.sum(), sampled.sum() / t.sum()


def step_power(pm: PowerModel, uc, um, busy, sm) -> np.ndarray:
    """PowerModel.power over arrays of steps: the kernels' power, capped at the board limit, for the
    busy share of each step, idle power for the rest."""
    busy = np.clip(busy, 0.0, 1.0)
    on = np.maximum(busy, 1e-12)
    running = np.minimum(pm.max_power, pm.idle + sm * (pm.active + pm.compute * uc / on) + pm.memory * um / on)
    return pm.idle + busy * (running - pm.idle)


def rows_of(args) -> list:
    rows = [r for r in MLENERGY_V3 if (not args.models or r[0] in args.models) and (not args.gpus or r[1] in args.gpus)]
    return [r for r in rows if r[0] == POWER_FIT[args.fit] and r[1] == args.fit] if args.fit else rows


HBM_PJ_PER_BIT = 3.97     # HBM2 access energy (O'Connor et al., "Fine-Grained DRAM", MICRO 2017): memory_power


def fit(gpu: str, runs: list, hw: HardwareConfig) -> HardwareConfig:
    """Least squares of the measured mean power (relative error) over active and compute power, each
    replay's steps taken at the measured throughput (the power model apart from the time model's error);
    memory power is the HBM's access energy at full bandwidth (HBM_PJ_PER_BIT), not fitted."""
    from scipy.optimize import minimize
    memory = round(hw.mem_bandwidth * 8 * HBM_PJ_PER_BIT * 1e-12, 0)

    def loss(x):
        pm = PowerModel(hw.idle_power, hw.max_power, x[0], x[1], memory)
        errors = [predicted(steps, pm, row[2], row[8])[1] / row[6] - 1 for row, steps in runs]
        return float(np.sum(np.square(errors)))
    best = minimize(loss, x0=[200.0, 300.0], bounds=[(0, hw.max_power), (0, 4 * hw.max_power)], method="L-BFGS-B")
    active, compute = (round(float(v), 0) for v in best.x)
    print(f"fit on {len(runs)} {POWER_FIT[gpu]} configurations on {gpu}: active_power {active:g} W, compute_power "
          f"{compute:g} W, memory_power {memory:g} W (rms power error {np.sqrt(best.fun / len(runs)):.1%})")
    return replace(hw, active_power=active, compute_power=compute, memory_power=memory)


def fit_host(gpu: str, hw: HardwareConfig, prompt_mean: float, engine: str, overlap_norm: float | None = None) -> tuple:
    """Grid search of the host's time per step and per running request (on top of the serving engine's)
    for the least mean |log(simulated / measured throughput)| over FIT_MODEL's configurations on `gpu`
    (absolute, not squared: one published configuration is out of line with its neighbours). On the A100:
    benchmark v2.0's rows (vLLM 0.5.4, synchronous: `--serving-engine eager_nccl`). With `overlap_norm` (a
    partial overlap of host and GPU) the grid is wider: 0-4 ms x 40-90 us. Returns (the error, step s, per-request s)."""
    if gpu == "a100":
        rows = [(r[0], r[1], r[2], r[3], r[4], r[5], None, r[6], r[7]) for r in MLENERGY_V2_A100 if r[0] == FIT_MODEL]
        grid = ((0.0, 1e-3, 2e-3), (325e-6, 350e-6, 375e-6, 400e-6, 425e-6))
    else:
        rows = [r for r in MLENERGY_V3 if r[0] == FIT_MODEL and r[1] == gpu]
        grid = ((2e-3, 3e-3, 4e-3), (60e-6, 70e-6, 80e-6, 90e-6))
        if overlap_norm is not None:
            grid = ((0.0, 1e-3, 2e-3, 3e-3, 4e-3), (40e-6, 50e-6, 60e-6, 70e-6, 80e-6, 90e-6))
    best = None
    for step in grid[0]:
        for per_request in grid[1]:
            h = host_timed(hw, "fit", step, per_request)
            errors = []
            for row in rows:
                steps, _ = replay(row[0], gpu, row[2], row[3], row[5], prompt_mean, h, engine, overlap_norm=overlap_norm)
                errors.append(np.log(steps[:, 3].sum() / steps[:, 0].sum() / row[8]))
            mean = float(np.mean(np.abs(errors)))
            print(f"step_overhead {step * 1e3:.0f} ms, host_per_request {per_request * 1e6:.0f} us: mean |log "
                  f"throughput error| {mean:.3f} ({' '.join(f'{np.expm1(e):+.0%}' for e in errors)})", flush=True)
            best = min(best or (mean, step, per_request), (mean, step, per_request))
    print(f"fit on {len(rows)} {FIT_MODEL} configurations on {gpu}: step_overhead {best[1] * 1e3:g} ms, "
          f"host_per_request {best[2] * 1e6:g} us (mean |log throughput error| {best[0]:.3f})")
    return best


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", choices=("h100", "b200"), help="fit the power constants of this GPU on its POWER_FIT model")
    ap.add_argument("--models", nargs="*", help="only these models (mlenergy_data.SHAPES)")
    ap.add_argument("--gpus", nargs="*", help="only these GPUs (h100, b200)")
    ap.add_argument("--prompt-mean", type=float, default=250.0, help="mean prompt tokens (assumed; see the doc)")
    ap.add_argument("--serving-engine", default="vllm", help="a configs/serving_engine/ preset (none: kernel time)")
    ap.add_argument("--power-limit", default="cap", choices=("cap", "throttle"),
                    help="at the board limit: the clock drops (throttle, as GPUs do) or only the power is held (cap)")
    ap.add_argument("--v2-a100", action="store_true", help="the A100 rows of benchmark v2.0 (vLLM 0.5.4) instead")
    ap.add_argument("--host", help="a configs/host/ preset: the testbed's host time (none: kernels only; default "
                    f"{HOST}, with --v2-a100 {HOST_V2})")
    ap.add_argument("--fit-host", choices=("h100", "b200", "a100"), help="fit the host time on Llama-3.1-8B on this GPU")
    ap.add_argument("--host-time", nargs=2, type=float, metavar=("MS", "US"),
                    help="the testbed host's time per step (ms) and per running request (us) instead of --host's")
    ap.add_argument("--overlap-norm", type=float, metavar="P",
                    help="serving_engine.async_overlap_norm: host and GPU overlap partly (default: fully)")
    args = ap.parse_args(argv)
    if args.v2_a100 and (args.host_time or args.overlap_norm is not None):
        ap.error("--host-time and --overlap-norm apply to benchmark v3.0's rows: --v2-a100 replays v2.0's synchronous "
                 "engine on its own host preset (--host)")
    if args.v2_a100:
        return check_v2_a100(args)
    args.host = args.host or HOST
    if args.fit_host:
        fit_host(args.fit_host, load_group("hardware", args.fit_host, HardwareConfig), args.prompt_mean,
                 args.serving_engine, args.overlap_norm)
        return
    hardware = {g: on_host(load_group("hardware", g, HardwareConfig), args.host) for g in ("h100", "b200")}
    if args.host_time:
        ms, us = args.host_time
        hardware = {g: host_timed(h, "given", ms * 1e-3, us * 1e-6) for g, h in hardware.items()}
    limit = "cap" if args.fit else args.power_limit      # (a fit reads utilisations at the measured time)
    runs = [(row, replay(row[0], row[1], row[2], row[3], row[5], args.prompt_mean, hardware[row[1]],
                         args.serving_engine, limit, args.overlap_norm)[0]) for row in rows_of(args)]
    if args.fit:
        hardware[args.fit] = fit(args.fit, runs, hardware[args.fit])
    print(f"{'model':15} {'GPU':5} {'TP':>2} {'batch':>5} | {'J/tok meas':>10} {'sim':>7} {'error':>7} | "
          f"{'W meas':>7} {'sim':>7} {'error':>7} | {'tok/s meas':>10} {'sim':>7} {'error':>7} | {'at meas. time':>13}")
    pairs: dict = {}
    for row, steps in runs:
        model, gpu, tp, batch, _, _, power, jpt, tput, _ = row
        pm, exponent = PowerModel.of(hardware[gpu]), hardware[gpu].clock_power_exponent
        pj, pw, pt = predicted(steps, pm, tp, exponent=exponent)
        alone = predicted(steps, pm, tp, tput, exponent)[0] / jpt - 1
        e = pj / jpt - 1
        pairs.setdefault((model, gpu), []).append((e, alone, pt / tput - 1))
        print(f"{model:15} {gpu:5} {tp:>2} {batch:>5} | {jpt:>10.4f} {pj:>7.4f} {e:>+7.1%} | {power:>7.0f} {pw:>7.0f} "
              f"{pw / power - 1:>+7.1%} | {tput:>10.0f} {pt:>7.0f} {pt / tput - 1:>+7.1%} | {alone:>+13.1%}")
    print(f"\nJ per output token by model/GPU pair ({len(pairs)} pairs; power fitted on {POWER_FIT}): the sim "
          "end to end, and the power model at the measured throughput")
    print(f"{'model':15} {'GPU':5} {'configs':>7} | {'MAPE':>6} {'bias':>7} {'worst':>7} {'<=25%':>5} | {'tok/s MAPE':>10} "
          f"| {'power model MAPE':>16} {'worst':>7} {'<=25%':>5}")
    for (model, gpu), errors in pairs.items():
        a, b, c = (np.array(x) for x in zip(*errors))
        print(f"{model:15} {gpu:5} {len(a):>7} | {np.mean(np.abs(a)):>6.1%} {a.mean():>+7.1%} "
              f"{a[np.argmax(np.abs(a))]:>+7.1%} {'yes' if np.mean(np.abs(a)) <= 0.25 else 'no':>5} | "
              f"{np.mean(np.abs(c)):>10.1%} | {np.mean(np.abs(b)):>16.1%} {b[np.argmax(np.abs(b))]:>+7.1%} "
              f"{'yes' if np.mean(np.abs(b)) <= 0.25 else 'no':>5}")


def check_v2_a100(args) -> None:
    hw = load_group("hardware", "a100", HardwareConfig)
    hw = on_host(hw, args.host or HOST_V2)
    print(f"{'model':15} {'TP':>2} {'batch':>5} | {'J/tok meas':>10} {'sim':>7} {'error':>7} | {'tok/s meas':>10} "
          f"{'sim':>7} {'error':>7}")
    for model, gpu, tp, batch, _, out, jpt, tput in MLENERGY_V2_A100:
        steps, _ = replay(model, gpu, tp, batch, out, args.prompt_mean, hw, args.serving_engine, args.power_limit)
        pj, _, pt = predicted(steps, PowerModel.of(hw), tp, exponent=hw.clock_power_exponent)
        print(f"{model:15} {tp:>2} {batch:>5} | {jpt:>10.4f} {pj:>7.4f} {pj / jpt - 1:>+7.1%} | {tput:>10.0f} {pt:>7.0f} "
              f"{pt / tput - 1:>+7.1%}")


if __name__ == "__main__":
    main()
