"""Simulated data plane: step time from a cost model of the batch (DESIGN §5).

No model runs. One of three cost models prices each step (`build_cost_model`):
a model of the shape on a GPU spec (`cost_model=shaped`, the default:
`policylab.dataplane.shaped`; `roofline` and `kernel` are the two it grew from),
a measured GPU profile (`dataplane.profile=DIR`, `policylab.dataplane.profile`), or a fit
on the real data plane (`dataplane.calibration=FILE`, `policylab.dataplane.fitted`).
Sampled tokens are deterministic ids, so the engine path is identical to a real run.
"""
from __future__ import annotations

import math
from operator import itemgetter

import numpy as np

from policylab.core.config import HardwareConfig, ModelConfig
from policylab.dataplane.config import SimPlaneConfig
from policylab.core.batch import Batch, StepResult
from policylab.core.capabilities import Capability
from policylab.core.rng import splitmix64
from policylab.dataplane.host_time import HostTime
from policylab.dataplane.energy import POWER_LIMITS, THROTTLE_STEP, clocked, meter_for
from policylab.dataplane.precision import plane_precision
from policylab.dataplane.roofline import ModelShape, Roofline
from policylab.dataplane.serving_engine import ServingEngine

SIM_CAPABILITIES = frozenset({Capability.KV_BYTES, Capability.DRAFTS, Capability.POSITIONAL_TOKENS})
MIN_VOCAB = 32    # ids 0..15 and the top 16 are left out of sampled ids (special tokens)
COST_MODELS = ("shaped", "roofline", "kernel")
MAX_TIME_NOISE = 0.3   # relative: beyond it a step duration would often clip at 0


def build_cost_model(model: ModelConfig, hardware: HardwareConfig, dp: SimPlaneConfig, precision=None):
    """The cost model the config names; each has step_time(q, ctx, tokens, sampled) and describe().
    `precision` (policylab.dataplane.precision; None: the model's own dtype) prices the shape-based ones."""
    if dp.calibration and dp.profile:
        raise ValueError("dataplane.calibration and dataplane.profile are two cost models: set one of them")
    if dp.tensor_parallel < 1:
        raise ValueError(f"dataplane.tensor_parallel must be >= 1, got {dp.tensor_parallel}")
    if dp.cost_model not in COST_MODELS:
        raise ValueError(f"dataplane.cost_model must be one of {', '.join(COST_MODELS)}, got '{dp.cost_model}'")
    if dp.pipeline_parallel > 1 and (dp.calibration or dp.profile):
        raise ValueError("dataplane.pipeline_parallel > 1 is priced by the roofline and kernel cost models only: "
                         "unset dataplane.profile / dataplane.calibration")
    if dp.calibration and dp.tensor_parallel > 1:
        raise ValueError("dataplane.calibration is a fit of the plane it measured (one device): it cannot price "
                         "dataplane.tensor_parallel > 1; use the roofline, cost_model=kernel or a profile")
    if precision is not None and not precision.native and (dp.calibration or dp.profile):
        raise ValueError("dataplane.profile / dataplane.calibration measured one precision: weight_dtype, "
                         "kv_cache_dtype and compute_dtype price the shape-based cost models only (leave them auto)")
    if dp.calibration:
        from policylab.dataplane.fitted import load_calibration
        calibration = load_calibration(dp.calibration)
        if hardware.host is not None:       # a host preset: what the fitted plane's steps did not include
            calibration.host = HostTime(hardware)
        return calibration
    if dp.profile:
        from policylab.dataplane.profile import ProfileCostModel
        return ProfileCostModel(model, hardware, dp)
    engine = ServingEngine(dp.serving_engine)
    if dp.cost_model == "shaped":
        from policylab.dataplane.shaped import ShapedCostModel
        return ShapedCostModel(model, hardware, dp.tensor_parallel, dp.pipeline_parallel, engine, precision)
    if dp.cost_model == "kernel":
        from policylab.dataplane.kernel_model import KernelCostModel
        return KernelCostModel(model, hardware, dp.tensor_parallel, dp.pipeline_parallel, engine, precision)
    return Roofline(model, hardware, dp.tensor_parallel, dp.pipeline_parallel, engine, precision)


def check_cost_parameters(model: ModelConfig, hw: HardwareConfig, dp: SimPlaneConfig) -> None:
    """Refuse parameters that would give a step a duration that is not finite and >= 0 (a NaN
    step_overhead hung the virtual clock; mem_bandwidth=0 divided by zero)."""
    for name in ("peak_flops", "mem_bandwidth", "mem_bytes", "flops_efficiency", "bw_efficiency", "link_bandwidth",
                 "gemm_efficiency", "attention_efficiency", "num_sms", "gemm_tile_m", "gemm_tile_n",
                 "curve_efficiency", "elementwise_bw_efficiency", "gemm_wave_tile_m", "gemm_wave_tile_n",
                 "decode_attention_blocks_per_sm"):
        value = getattr(hw, name)
        if not (isinstance(value, (int, float)) and 0 < value < math.inf):
            raise ValueError(f"hardware.{name} must be a finite number > 0, got {value!r}")
    for name in ("flops_efficiency", "bw_efficiency", "elementwise_bw_efficiency"):
        if getattr(hw, name) > 1:
            raise ValueError(f"hardware.{name} is the achieved share of the peak: at most 1, got {getattr(hw, name)!r}")
    for name in ("kernel_latency", "step_overhead", "host_per_request", "host_per_token", "link_latency",
                 "collective_latency", "attention_floor", "decode_attention_floor", "gemm_half_m",
                 "elementwise_latency"):
        value = getattr(hw, name)
        if not (isinstance(value, (int, float)) and 0 <= value < math.inf):
            raise ValueError(f"hardware.{name} must be a finite number >= 0 (seconds), got {value!r}")
    if not (isinstance(hw.attention_length_slope, (int, float)) and 0 <= hw.attention_length_slope < 1):
        raise ValueError("hardware.attention_length_slope is the share of attention efficiency lost per halving "
                         f"of a prefill chunk: in [0, 1), got {hw.attention_length_slope!r}")
    for name in ("gemm_wave_tile_m", "gemm_wave_tile_n"):
        if getattr(hw, name) != int(getattr(hw, name)):
            raise ValueError(f"hardware.{name} is a GEMM tile's rows or columns: a whole number >= 1, "
                             f"got {getattr(hw, name)!r}")
    if not (isinstance(dp.time_noise, (int, float)) and 0 <= dp.time_noise <= MAX_TIME_NOISE):
        raise ValueError(f"dataplane.time_noise must be a number in [0, {MAX_TIME_NOISE}] (relative standard "
                         f"deviation of a step's duration), got {dp.time_noise!r}")
    if not 0 < dp.gpu_memory_utilization <= 1:
        raise ValueError(f"dataplane.gpu_memory_utilization must be in (0, 1], got {dp.gpu_memory_utilization!r}")
    kv_bytes = dp.kv_cache_memory_bytes
    if kv_bytes is not None and not (isinstance(kv_bytes, (int, float)) and 0 < kv_bytes <= hw.mem_bytes):
        raise ValueError("dataplane.kv_cache_memory_bytes is the KV cache's bytes on each GPU: > 0 and at most "
                         f"hardware.mem_bytes ({hw.mem_bytes:g}), or null, got {kv_bytes!r}")
    if model.vocab_size <= MIN_VOCAB:
        raise ValueError(f"model.vocab_size must be > {MIN_VOCAB} (sampled ids stay clear of special tokens), "
                         f"got {model.vocab_size}")
    for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "dtype_bytes"):
        if getattr(model, name) < 1:
            raise ValueError(f"model.{name} must be >= 1, got {getattr(model, name)}")


class SimDataPlane:
    kind = "sim"
    def __init__(self, model: ModelConfig, hardware: HardwareConfig, dp: SimPlaneConfig, seed: int = 0):
        check_cost_parameters(model, hardware, dp)
        self.hw, self.dp, self.seed, self.model = hardware, dp, seed, model
        self.precision = plane_precision(model, hardware, dp)
        self.shape = ModelShape(model, dp.tensor_parallel, self.precision)
        self.gpus = dp.tensor_parallel * dp.pipeline_parallel
        self.vocab_size, self.eos_token_id = model.vocab_size, model.eos_token_id
        self.cost_model = build_cost_model(model, clocked(hardware, dp.gpu_clock_mhz), dp, self.precision)
        engine = getattr(self.cost_model, "engine", None)
        # the shape-based cost models take the step's leading decodes and context sum from the plane,
        # which the energy meter's work shares (one pass over the batch's contexts a step)
        self._shares_sums = isinstance(self.cost_model, Roofline)
        # the engine's async scheduling: an arrival joins one step later (core.extensions.async_scheduling)
        self.capabilities = SIM_CAPABILITIES | ({Capability.SCHEDULES_AHEAD} if engine is not None
                                                and engine.async_scheduling else frozenset())
        # seconds a load generator's TTFT and E2E include beyond the engine's (fidelity-e2e adds them)
        self.client_latency = engine.cfg.client_latency if engine is not None else 0.0
        # GPU energy of every step (policylab.dataplane.energy; None where the hardware gives no power model)
        self.meter = meter_for(self.shape, hardware, self.gpus, dp.pipeline_parallel, self.precision, dp.gpu_clock_mhz,
                               getattr(self.cost_model, "engine", None))
        self.gpu_clock = None                # a settable clock (attach_clock): the cost model follows it
        self._mhz, self._clock_models = dp.gpu_clock_mhz, {}
        if dp.power_limit not in POWER_LIMITS:
            raise ValueError(f"dataplane.power_limit must be one of {', '.join(POWER_LIMITS)}, got '{dp.power_limit}'")
        self._throttle = dp.power_limit == "throttle" and self.meter is not None and bool(hardware.max_clock_mhz)
        if dp.power_limit == "throttle" and not self._throttle:
            raise ValueError(f"dataplane.power_limit=throttle lowers the SM clock: hardware {hardware.name} needs a "
                             "power model and a max_clock_mhz (configs/hardware/)")
        self._ratio_models: dict = {}        # power_limit=throttle: clock ratio -> cost model
        self._next_token: list = []          # position -> id sampled after it (see execute)
        self.speculation = None              # verifies draft tokens (policylab.dataplane.speculative)
        if dp.time_noise:                    # (the exact cost model otherwise: no draw per step)
            self._noise = np.random.default_rng([dp.time_noise_seed, 0x71AE])
            self._exact_step_time, self._step_time = self._step_time, self._noisy_step_time
        # execute calls the shape-based cost model itself, without the _step_time hop (where no noise and
        # no subclass's own _step_time come between)
        self._direct = self._shares_sums and not dp.time_noise and type(self)._step_time is SimDataPlane._step_time

    def num_kv_blocks(self, block_size: int) -> int:
        """vLLM's accounting: every GPU's memory x gpu_memory_utilization, less the weights and what the
        serving engine keeps besides (activation peak, communication buffers), holds KV blocks; or, as
        vLLM's --kv-cache-memory-bytes, the bytes each GPU was given for KV."""
        if self.dp.kv_cache_memory_bytes is not None:
            if self.shape.weight_bytes / self.gpus + self.dp.kv_cache_memory_bytes > self.hw.mem_bytes:
                raise ValueError(f"model weights ({self.shape.weight_bytes / self.gpus / 1e9:.1f} GB a GPU) and "
                                 f"dataplane.kv_cache_memory_bytes ({self.dp.kv_cache_memory_bytes / 1e9:.1f} GB) do "
                                 f"not fit in one {self.hw.name}'s memory ({self.hw.mem_bytes / 1e9:.1f} GB)")
            return int(self.dp.kv_cache_memory_bytes * self.gpus // (self.shape.kv_bytes_per_token_all_gpus()
                                                                     * block_size))
        e = self.dp.serving_engine
        reserve = self.gpus * ((e.non_kv_memory + (e.non_kv_memory_parallel if self.gpus > 1 else 0.0))
                               if e is not None else 0.0)
        free = self.hw.mem_bytes * self.gpus * self.dp.gpu_memory_utilization - self.shape.weight_bytes - reserve
        if free <= 0:
            raise ValueError(f"model weights ({self.shape.weight_bytes / 1e9:.1f} GB)"
                             + (f" and the engine's {reserve / 1e9:.1f} GB besides" if reserve else "")
                             + f" do not fit in {self.gpus} x {self.hw.name} memory x {self.dp.gpu_memory_utilization}"
                             + ("" if self.gpus > 1 else ": raise dataplane.tensor_parallel"))
        return int(free // (self.shape.kv_bytes_per_token_all_gpus() * block_size))

    def kv_block_bytes(self, block_size: int) -> float:
        """Bytes one KV block holds on one GPU's link (each tensor-parallel rank moves its share)."""
        return self.shape.kv_bytes_per_token * block_size / self.dp.tensor_parallel

    def allocate_kv(self, num_blocks: int, block_size: int) -> None:
        """Nothing to allocate: the simulated cache is pure accounting."""

    def step_time(self, batch: Batch) -> float:
        """The modelled duration of `batch` (also times real-plane steps: dataplane.step_time=model)."""
        tokens, sampled = sum(batch.query_lens), sum(map(bool, batch.sample))
        if self.gpu_clock is not None and self.gpu_clock.mhz != self._mhz:
            self._follow_clock()
        duration = self._step_time(batch, tokens, sampled)
        return duration if self.meter is None else self._metered(batch, tokens, sampled, duration, None,
                                                                 getattr(self.cost_model, "kernel_share", None))

    def _metered(self, batch: Batch, tokens: int, sampled: int, duration: float, context: int | None = None,
                 share: float | None = None) -> float:
        """Charge the step's energy; with power_limit=throttle a step that would draw more than the
        board limit runs at the highest clock level where it fits, and takes that clock's time.
        `context`: sum(batch.context_lens), where the caller has it; `share` the cost model's kernel share."""
        meter = self.meter
        if duration <= 0:
            return duration
        work = meter.work.of(batch.query_lens, batch.context_lens, tokens, sampled, batch.decodes, context)
        if not self._throttle:
            meter.step(batch, tokens, sampled, duration, None, work, share)
            return duration
        ratio = meter.ratio
        if meter.demand(batch, tokens, sampled, duration, ratio, work, share)[0] > self.hw.max_power:
            low = (self.hw.min_clock_mhz or self.hw.max_clock_mhz) / self.hw.max_clock_mhz
            while ratio - THROTTLE_STEP >= low - 1e-9:
                ratio = round(ratio - THROTTLE_STEP, 6)
                model = self._model_at(ratio)
                duration = model.step_time(batch.query_lens, batch.context_lens, tokens, sampled)
                share = getattr(model, "kernel_share", None)
                if meter.demand(batch, tokens, sampled, duration, ratio, work, share)[0] <= self.hw.max_power:
                    break
        meter.step(batch, tokens, sampled, duration, ratio, work, share)
        return duration

    def _model_at(self, ratio: float):
        """The cost model at SM clock `ratio` x max (power_limit=throttle's levels, cached)."""
        model = self._ratio_models.get(ratio)
        if model is None:
            model = self._ratio_models[ratio] = build_cost_model(
                self.model, clocked(self.hw, ratio * self.hw.max_clock_mhz), self.dp, self.precision)
        return model

    def attach_clock(self, clock) -> None:
        """Let `clock` (policylab.dataplane.energy.GpuClock, set between steps by an energy-aware
        policy) choose the SM clock each step is timed and powered at."""
        self.gpu_clock = clock
        self._clock_models[self._mhz] = self.cost_model

    def _follow_clock(self) -> None:
        mhz = self.gpu_clock.mhz
        model = self._clock_models.get(mhz)
        if model is None:
            model = self._clock_models[mhz] = build_cost_model(self.model, clocked(self.hw, mhz), self.dp,
                                                               self.precision)
        self.cost_model, self._mhz = model, mhz
        if self.meter is not None:
            self.meter.set_clock(mhz)

    def energy_report(self) -> dict | None:
        """This plane's energy so far (policylab.dataplane.energy.EnergyMeter.report), or None."""
        return None if self.meter is None else self.meter.report()

    def _step_time(self, batch: Batch, tokens: int, sampled: int, context: int | None = None) -> float:
        if self._shares_sums:
            return self.cost_model.step_time(batch.query_lens, batch.context_lens, tokens, sampled, batch.decodes,
                                             context)
        return self.cost_model.step_time(batch.query_lens, batch.context_lens, tokens, sampled)

    def _noisy_step_time(self, batch: Batch, tokens: int, sampled: int, context: int | None = None) -> float:
        """The modelled duration with independent multiplicative noise (`dataplane.time_noise`): a
        replay's sensitivity to step-time error, which no measured timer is free of."""
        return self._exact_step_time(batch, tokens, sampled, context) * max(
            0.0, 1.0 + self.dp.time_noise * self._noise.standard_normal())

    def describe_cost_model(self) -> dict:
        """Which cost model produced this run's step times (recorded in summary.json)."""
        noise = {"time_noise": self.dp.time_noise, "time_noise_seed": self.dp.time_noise_seed} \
            if self.dp.time_noise else {}
        clock = {"gpu_clock_mhz": self.dp.gpu_clock_mhz} if self.dp.gpu_clock_mhz is not None else {}
        if self._throttle:
            clock["power_limit"] = "throttle"
        return {**self.cost_model.describe(), **noise, **clock}

    def execute(self, batch: Batch) -> StepResult:
        """Deterministic ids that depend on the position only, clear of special tokens.

        Lengths come from the trace, not EOS, so ids matter only to the prefix cache: like
        greedy decoding, identical prompts continue identically, and different prompts never
        share an output block (the hash chain carries the prompt). The id sampled after the
        token at position p is `_next_token[p]`, so a decode step costs one C-level pass.
        """
        if self.gpu_clock is not None and self.gpu_clock.mhz != self._mhz:
            self._follow_clock()
        if batch.spec_lens is not None:               # drafts to verify: the acceptance model
            result = self._speculation().execute(self, batch)
            if self.meter is not None:        # (the draft's steps taken at the target step's kernel share)
                self.meter.step(batch, sum(batch.query_lens), len(result.sampled), result.duration,
                                kernel_share=getattr(self.cost_model, "kernel_share", None))
            return result
        ctx, q, d = batch.context_lens, batch.query_lens, batch.decodes
        nxt, sample, r = self._next_token, batch.sample, len(q)
        try:                                             # (one C-level gather)
            if d > 1:            # the leading decodes' position is their context: all gathered so, the rest redone
                ids = list(itemgetter(*ctx)(nxt))
                tokens = d                               # (the leading decodes: one token each)
                if d < r:
                    del ids[d:]
                    i = d
                    while i < r:         # (the few other entries by index: no slices, no range object)
                        n = q[i]
                        tokens += n
                        if sample[i]:
                            ids.append(nxt[ctx[i] + n - 1])
                        i += 1
            elif (tokens := sum(q)) == r and all(sample):   # decodes only: position = context
                ids = list(itemgetter(*ctx)(nxt)) if r > 1 else [nxt[p] for p in ctx]
            else:
                ids = [nxt[p] for p in self._positions(batch)]
        except IndexError:
            positions, tokens = self._positions(batch), sum(q)
            self._grow_tokens(max(positions) + 1)
            nxt = self._next_token
            ids = [nxt[p] for p in positions]
        context, model = sum(ctx), self.cost_model
        if self._direct:          # (the shape-based cost models without noise: priced without a hop)
            duration, share = model.step_time(q, ctx, tokens, len(ids), d, context), model.kernel_share
        else:
            duration = self._step_time(batch, tokens, len(ids), context)
            share = getattr(model, "kernel_share", None)
        if self.meter is not None:
            if self._throttle:
                duration = self._metered(batch, tokens, len(ids), duration, context, share)
            else:
                self.meter.step(batch, tokens, len(ids), duration, None, None, share, context)
        return StepResult.of((ids, duration, None))

    @staticmethod
    def _positions(batch: Batch) -> list:
        """The position after which each sampled entry's token comes (its last computed token's)."""
        ctx, q, d = batch.context_lens, batch.query_lens, batch.decodes
        return ctx[:d] + [c + n - 1 for c, n, s in zip(ctx[d:], q[d:], batch.sample[d:]) if s]

    def token_at(self, position: int) -> int:
        """The id sampled after the token at `position` (as `execute` samples it)."""
        if position >= len(self._next_token):
            self._grow_tokens(position + 1)
        return self._next_token[position]

    def tokens(self, start: int, stop: int) -> list:
        """The ids sampled after the tokens at positions start..stop-1 (a decode batch's deferred ones)."""
        if stop > len(self._next_token):
            self._grow_tokens(stop)
        return self._next_token[start:stop]

    def _speculation(self):
        if self.speculation is None:           # (no speculative config given: n-gram at its defaults)
            from policylab.dataplane.speculative import SimSpeculation
            from policylab.core.extensions.speculation import SpeculativeConfig
            self.speculation = SimSpeculation(SpeculativeConfig(), self.seed)
        return self.speculation

    def _grow_tokens(self, size: int) -> None:
        """Extend the id table to cover `size` positions (doubling; each id a hash of seed and position)."""
        have = len(self._next_token)
        size = max(size, 2 * have, 4096)
        ids = splitmix64(self.seed * 0xBF58476D1CE4E5B9, have, size - have) % np.uint64(self.vocab_size - MIN_VOCAB)
        self._next_token += (ids + np.uint64(16)).astype(np.int64).tolist()
