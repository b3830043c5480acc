"""GPU energy of a replay: a power model per step, summed per request and per run.

Each step's work per GPU, from the model's shape at its precision (`StepWork`): the FLOPs of
its GEMMs, attention and LM head, and the bytes it moves (the weights it reads once, the
KV it reads and writes, the elementwise traffic). Over the step's modelled duration t, that
work is a compute utilisation u_c (FLOPs / (t x the peak of their dtype at the clock)) and a
memory utilisation u_m (bytes / (t x peak bandwidth)). A GPU then draws

    P = min(max_power, idle_power + s(f) x (active_power x b + compute_power x u_c) + memory_power x u_m)
    s(f) = (clock / max_clock) ** clock_power_exponent

idle_power is what the board draws doing nothing; active_power what its clocked SMs add while
they run the step's kernels (with the SMs stalled on memory, as in a decode, this is most of what
a decode adds over idle), for the share b of the step that is kernels: a synchronous engine's host
time (`hardware.step_overhead`, the serving engine's host work; under async scheduling it hides
behind the GPU) and the tensor-parallel collectives are spent waiting; compute_power and
memory_power the rise to full tensor-core and full HBM use; the board limit (TDP) caps the sum.
Every constant is per GPU preset in configs/hardware/*.yaml with its source;
`experiments/check_energy_mlenergy.py` fits active and compute power on the ML.ENERGY benchmark's
measured vLLM power on one model per GPU and checks the others.

A step's energy is P x t x GPUs (tensor x pipeline parallel, each at the same utilisation).
Between steps the GPUs idle at idle_power (`energy_summary` charges the makespan's idle time).
A request is charged its share of each step it ran in, by the tokens it computed there (a
decode step splits evenly; a prefill chunk of 512 tokens beside 64 decodes takes 512/576).

The clock knob (`dataplane.gpu_clock_mhz`) scales every compute peak by clock / max_clock (the
tensor cores run at the SM clock; the HBM does not) and the SM-side power by s(f): a memory-bound
decode slows little and draws less, a compute-bound prefill slows in proportion. With
`dataplane.power_limit=throttle` a step whose power would exceed the board limit runs at the
highest clock (in `THROTTLE_STEP`s of the maximum) at which it fits, as a GPU's power management
lowers its clock: compute-bound steps at the limit take longer. The default, `cap`, holds the
power at the limit and leaves the step's time as the cost model gives it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from policylab.core.config import HardwareConfig
from policylab.dataplane.charges import Charges, Totals
from policylab.dataplane.host_time import HostTime
from policylab.dataplane.moe import experts_touched
from policylab.dataplane.parallel import Link
from policylab.dataplane.roofline import causal_pairs

POWER_LIMITS = ("cap", "throttle")
THROTTLE_STEP = 0.05            # power_limit=throttle: clock levels tried, as shares of the maximum


def clock_ratio(hw: HardwareConfig, mhz) -> float:
    """clock / max_clock for `mhz` (None: the maximum), refused outside the GPU's range."""
    if mhz is None:
        return 1.0
    if not hw.max_clock_mhz:
        raise ValueError(f"dataplane.gpu_clock_mhz: hardware {hw.name} gives no max_clock_mhz, so its clock "
                         "cannot be set (leave dataplane.gpu_clock_mhz null)")
    low = hw.min_clock_mhz or hw.max_clock_mhz
    if not (isinstance(mhz, (int, float)) and low <= mhz <= hw.max_clock_mhz):
        raise ValueError(f"dataplane.gpu_clock_mhz must be a clock in [{low:g}, {hw.max_clock_mhz:g}] MHz on "
                         f"{hw.name}, got {mhz!r}")
    return mhz / hw.max_clock_mhz


def clocked(hw: HardwareConfig, mhz) -> HardwareConfig:
    """The GPU at SM clock `mhz`: every compute peak scaled by clock / max_clock (None: as it is)."""
    r = clock_ratio(hw, mhz)
    if r == 1.0:
        return hw
    return replace(hw, peak_flops=hw.peak_flops * r,
                   peak_flops_fp8=hw.peak_flops_fp8 and hw.peak_flops_fp8 * r,
                   peak_flops_int8=hw.peak_flops_int8 and hw.peak_flops_int8 * r)


def check_power(hw: HardwareConfig) -> None:
    """Power constants that cannot describe a GPU are refused, naming the field."""
    if hw.idle_power is None:
        return
    for name in ("idle_power", "max_power", "active_power", "compute_power", "memory_power", "clock_power_exponent"):
        value = getattr(hw, name)
        if not (isinstance(value, (int, float)) and 0 <= value < math.inf):
            raise ValueError(f"hardware.{name} must be a finite number >= 0, got {value!r}")
    if hw.max_power <= hw.idle_power:
        raise ValueError(f"hardware.max_power ({hw.max_power} W) must exceed hardware.idle_power ({hw.idle_power} W)")


@dataclass(frozen=True)
class PowerModel:
    """The per-GPU power of a step from its utilisations (module doc); constants in watts."""
    idle: float
    max_power: float
    active: float
    compute: float
    memory: float
    sm_share: float = 1.0        # s(f) at the clock

    @classmethod
    def of(cls, hw: HardwareConfig, ratio: float = 1.0) -> "PowerModel":
        return cls(hw.idle_power, hw.max_power, hw.active_power, hw.compute_power, hw.memory_power,
                   ratio ** hw.clock_power_exponent)

    def running(self, u_compute: float, u_memory: float, busy: float = 1.0) -> float:
        """Watts while the step's kernels run (`busy` of the step; utilisations over the whole step),
        before the board limit: what the GPU's power management holds to max_power."""
        if busy <= 0:
            return self.idle
        return self.idle + self.sm_share * (self.active + self.compute * u_compute / busy) + self.memory * u_memory / busy

    def power(self, u_compute: float, u_memory: float, busy: float = 1.0) -> float:
        """Mean watts over the step: the kernels' power, capped at the board limit, for the share
        `busy` of the step they run, and idle power for the rest (the GPU waiting on the host or on
        its peers' collectives). Between idle_power and max_power whatever the utilisations."""
        busy = busy if busy < 1 else 1.0
        return self.over_step(self.running(u_compute, u_memory, busy), busy)

    def over_step(self, running: float, busy: float) -> float:
        """Mean watts over a step whose kernels draw `running` watts (`running()`) for the share
        `busy` of it (0..1), capped at the board limit, and idle power for the rest."""
        if busy <= 0:
            return self.idle
        return self.idle + busy * ((running if running < self.max_power else self.max_power) - self.idle)


class StepWork:
    """FLOPs (GEMM, other) and bytes of one step on one GPU, from the shape at its precision."""

    def __init__(self, shape, pp: int = 1, hw: HardwareConfig | None = None, engine=None):
        s = shape
        # host work the GPUs wait for: none under an engine's async scheduling (it hides behind the GPU)
        serial = hw is not None and not (engine is not None and engine.async_scheduling)
        self.host = HostTime(hw) if serial else None
        self.engine_host = engine if serial and engine is not None and engine.has_host_time else None
        self.link = Link(hw, s.tp, engine) if hw is not None and s.tp > 1 else None
        self.hidden_bytes, self.layers, self.vocab_bytes = s.hidden * s.dtype_bytes, s.layers, s.vocab * s.dtype_bytes
        w, a = s.weight_elem_bytes, s.dtype_bytes
        dense_mac = sum(k * n for k, n in s.gemms)
        moe_mac = sum(k * n for k, n in s.moe_gemms) if s.moe_layers else 0
        self.gemm_flops_token = 2.0 * (s.dense_layers * dense_mac + s.moe_layers * (moe_mac + s.top_k * 3 * s.hidden
                                                                                     * s.expert_f)) / pp
        self.static_bytes = (s.dense_layers * dense_mac + s.moe_layers * moe_mac) * w / pp   # weights read once
        self.expert_bytes = s.moe_layers * 3 * s.hidden * s.expert_f * w / pp                # per expert touched
        self.experts, self.top_k = s.experts, s.top_k
        vocab = s.vocab // s.tp
        self.head_flops, self.head_bytes = 2.0 * s.hidden * vocab, s.hidden * vocab * a
        self.pair_flops = s.attn_flops_per_pair * s.layers / pp
        self.kv_bytes_token = s.kv_bytes_per_token / pp
        self.token_bytes = (s.layers * s.elementwise_elems + 2 * s.hidden) * a / pp      # elementwise + embedding

    def waiting(self, requests: int, tokens: int, sampled: int, duration: float = 0.0,
                kernel_share: float | None = None) -> float:
        """Seconds of a step its GPUs spend waiting: on the host (the part of the step the cost model's
        `kernel_share` leaves over, serial or not; without one, the serial host time) and on the
        tensor-parallel collectives."""
        if kernel_share is not None:
            t = (1.0 - kernel_share) * duration
        else:
            t = self.host(requests, tokens) if self.host is not None else 0.0
            e = self.engine_host
            if e is not None:
                t += e.host_per_step + e.host_per_request * requests + e.host_per_token * tokens
        if self.link is not None:
            t += ((2 * self.layers + 1) * self.link.all_reduce(tokens * self.hidden_bytes)
                  + (self.link.all_gather(sampled * self.vocab_bytes) if sampled else 0.0))
        return t

    def of(self, q, ctx, tokens: int, sampled: int, leading: int = 0, context: int | None = None) -> tuple:
        """(GEMM FLOPs, other FLOPs at the BF16 peak, bytes) of a step whose first `leading` entries
        are one-token decodes (their terms of the sums are their context and 1: the same integers);
        `context`: sum(ctx), where the caller has it."""
        if context is None:
            context = sum(ctx)
        pairs = causal_pairs(q, ctx, tokens, leading, context)
        memory = (self.static_bytes + self.kv_bytes_token * (context + tokens) + self.token_bytes * tokens
                  + (self.head_bytes if sampled else 0))
        if self.experts:
            memory += self.expert_bytes * experts_touched(tokens, self.experts, self.top_k)
        return self.gemm_flops_token * tokens, self.pair_flops * pairs + self.head_flops * sampled, memory


class EnergyMeter:
    """Energy of every step a plane times, per run and per request (module doc)."""

    def __init__(self, shape, hw: HardwareConfig, gpus: int, pp: int = 1, gemm_speedup: float = 1.0, mhz=None,
                 engine=None):
        check_power(hw)
        self.hw, self.gpus, self.work = hw, gpus, StepWork(shape, pp, hw, engine)
        self._no_collectives = self.work.link is None       # (no tensor-parallel group: the plain path's steps)
        self.gemm_speedup = gemm_speedup
        self.busy_j = self.busy_s = self.throttled_s = 0.0
        self._charges = Charges()     # J charged to each request (logged a step at a time)
        self.record: list | None = None   # a list: each step's (duration, u_compute, u_memory, sampled, busy, clock ratio)
        self._run_ids = None          # decode-only steps on the same request list: their shares pending
        self._run_share = 0.0
        self.set_clock(mhz)

    def set_clock(self, mhz) -> None:
        r = clock_ratio(self.hw, mhz)
        self.mhz, self.ratio, self.power_model = mhz, r, PowerModel.of(self.hw, r)
        self._peak = self.hw.peak_flops * r
        self._gemm_peak = self._peak * self.gemm_speedup     # the GEMMs' dtype
        self._bw = self.hw.mem_bandwidth

    def demand(self, batch, tokens: int, sampled: int, duration: float, ratio: float, work=None,
               kernel_share: float | None = None) -> tuple:
        """(watts per GPU the step's kernels would draw without the board limit, its (u_c, u_m, busy))
        at clock ratio `ratio`; `work` is the step's StepWork.of, when the caller has it; `kernel_share`
        the share of the step the cost model has the GPUs run kernels (None: all but serial host time)."""
        work = work or self.work.of(batch.query_lens, batch.context_lens, tokens, sampled, batch.decodes)
        peak = self.hw.peak_flops * ratio
        u_c, u_m = self._utilisations(work, duration, peak, peak * self.gemm_speedup)
        busy = 1.0 - self.work.waiting(len(batch.query_lens), tokens, sampled, duration, kernel_share) / duration
        busy = busy if busy > 0 else 0.0
        return self._power_model(ratio).running(u_c, u_m, busy), (u_c, u_m, busy)

    def _power_model(self, ratio: float) -> PowerModel:
        return self.power_model if ratio == self.ratio else PowerModel.of(self.hw, ratio)

    def step(self, batch, tokens: int, sampled: int, duration: float, ratio: float | None = None, work=None,
             kernel_share: float | None = None, context: int | None = None) -> float:
        """Charge one step of `duration` seconds (at clock ratio `ratio`: a power-limited step ran
        below the set clock; its kernels running `kernel_share` of it, as the cost model gives it:
        the rest at idle power); its energy over all GPUs (J). `work` is the step's StepWork.of and
        `context` sum(batch.context_lens), where the caller has them."""
        if duration <= 0:
            return 0.0
        if work is None:
            work = self.work.of(batch.query_lens, batch.context_lens, tokens, sampled, batch.decodes, context)
        if ratio is None and kernel_share is not None and self._no_collectives and self.record is None:
            # every step of a default run: the set clock, the cost model's kernel share, no collectives. The
            # same utilisations and power model as demand's, without its general waiting time and clock
            # (tests/test_energy_charges.py holds the two paths to the same floats)
            u_c, u_m = self._utilisations(work, duration, self._peak, self._gemm_peak)
            busy = 1.0 - (1.0 - kernel_share) * duration / duration     # (waiting's arithmetic: the same float)
            pm = self.power_model
            energy = pm.over_step(pm.running(u_c, u_m, busy), busy) * duration * self.gpus
        else:
            ratio = self.ratio if ratio is None else ratio
            running, (u_c, u_m, busy) = self.demand(batch, tokens, sampled, duration, ratio, work, kernel_share)
            energy = self._power_model(ratio).over_step(running, busy) * duration * self.gpus
            if self.record is not None:
                self.record.append((duration, u_c, u_m, sampled, busy, ratio))
            if ratio != self.ratio:
                self.throttled_s += duration
        self.busy_j += energy
        self.busy_s += duration
        self._attribute(batch, energy, tokens)
        return energy

    def _utilisations(self, work: tuple, duration: float, peak: float, gemm_peak: float) -> tuple:
        """(compute, memory) utilisation of a step's work (StepWork.of) over `duration` at `peak` FLOP/s
        (`gemm_peak`: peak x gemm_speedup, the GEMMs' dtype)."""
        gemm, other, memory = work
        u_c = (gemm / gemm_peak + other / peak) / duration
        u_m = memory / (self._bw * duration)
        return (u_c if u_c < 1 else 1.0), (u_m if u_m < 1 else 1.0)

    def _attribute(self, batch, energy: float, tokens: int) -> None:
        ids, charges = batch.req_ids, self._charges
        if tokens == len(ids):                         # decodes only: even shares, flushed when the list changes
            if ids is not self._run_ids:
                self._flush()
                self._run_ids = ids
            self._run_share += energy / len(ids)
            return
        if self._run_ids is not None:
            self._flush()
        charges.charge_tokens(ids, energy / tokens, batch.decodes, batch.query_lens)

    def _flush(self) -> None:
        if self._run_ids is not None:
            self._charges.charge(self._run_ids, self._run_share)
        self._run_ids, self._run_share = None, 0.0

    @property
    def per_request(self) -> Totals:
        """req_id -> J charged so far (requests charged nothing left out)."""
        return self._charges.totals()

    def report(self) -> dict:
        """What `energy_summary` turns into the run's energy metrics (plain values; summary.json's `energy_meter`)."""
        self._flush()
        return {"busy_energy_j": self.busy_j, "busy_time_s": self.busy_s, "busy_gpu_s": self.busy_s * self.gpus,
                "throttled_time_s": self.throttled_s, "gpus": self.gpus,
                "idle_power_w": self.hw.idle_power, "max_power_w": self.hw.max_power,
                "gpu_clock_mhz": self.mhz, "per_request_j": self.per_request}


class GpuClock:
    """The SM clock of a plane's GPU, settable between steps (an energy-aware policy lowers it
    when its requests have slack); the plane times and powers each step at the clock it reads."""

    def __init__(self, hw: HardwareConfig, mhz=None):
        if not hw.max_clock_mhz:
            raise ValueError(f"hardware {hw.name} gives no max_clock_mhz: its clock cannot be set (a policy that "
                             "sets the clock needs a GPU preset with one, e.g. hardware=h100)")
        clock_ratio(hw, mhz)
        self.max_mhz, self.min_mhz = float(hw.max_clock_mhz), float(hw.min_clock_mhz or hw.max_clock_mhz)
        self.mhz = float(mhz) if mhz is not None else self.max_mhz
        self.hw = hw

    def set(self, mhz: float) -> None:
        """Lock the clock at `mhz` from the next step on (refused outside [min_mhz, max_mhz])."""
        clock_ratio(self.hw, mhz)
        self.mhz = float(mhz)


def meter_for(shape, hw: HardwareConfig, gpus: int, pp: int, precision, mhz, engine=None):
    """An EnergyMeter when the GPU preset has a power model (`idle_power` set), else None; `engine`
    (policylab.dataplane.serving_engine.ServingEngine) says which host work the GPUs wait for."""
    if hw.idle_power is None:
        return None
    return EnergyMeter(shape, hw, gpus, pp, precision.gemm_speedup if precision is not None else 1.0, mhz, engine)


def merge_reports(reports: list) -> dict | None:
    """One report of several meters (a cluster's replicas)."""
    reports = [r for r in reports if r]
    if not reports:
        return None
    out = {"busy_energy_j": sum(r["busy_energy_j"] for r in reports), "busy_time_s": sum(r["busy_time_s"] for r in reports),
           "busy_gpu_s": sum(r["busy_gpu_s"] for r in reports), "gpus": sum(r["gpus"] for r in reports),
           "throttled_time_s": sum(r.get("throttled_time_s", 0.0) for r in reports),
           "idle_power_w": sum(r["idle_power_w"] * r["gpus"] for r in reports) / sum(r["gpus"] for r in reports),
           "max_power_w": max(r["max_power_w"] for r in reports), "gpu_clock_mhz": reports[0]["gpu_clock_mhz"],
           "per_request_j": Totals.summed([r["per_request_j"] for r in reports])}
    return out
