"""The real data plane (`dataplane=torch`): our paged-KV transformer, one forward per step.

Runs on CPU (float32) or CUDA (bfloat16 by default). `execute` packs the flat batch,
runs one forward pass over every scheduled token (prefill chunks and decodes mixed),
samples where asked, and reports the measured time of the whole step: wall time
(`dataplane.timer=wall`, default), or with `dataplane.timer=cpu` the CPU time of the thread
that runs it, at one intra-op thread (`time.thread_time`, user + system), the least of
`dataplane.timer_repeats` executions of the same batch (a repeat rewrites the same K/V at the
same slots and samples the same tokens: the step's outcome does not change).

The CPU timer is for measuring on a shared machine: time the step spends descheduled while
other processes run is not counted, so two replays agree to ~1 % where wall time differs by
tens of percent. It still counts what contention does to the step's own work (caches and memory
bandwidth shared with neighbours: ~10 % between two replays on a loaded 2-core box), which the
least of k repeats removes where one repeat ran undisturbed; it leaves out what a step waits for without computing
(sleeps, I/O; none in a CPU step). It measures one core's work: it equals wall time only on an
idle machine with threads=1, and it is refused on CUDA, where the GPU does the work.
`dataplane.timer_reference=true` also divides out the machine's current speed, measured by a
fixed reference step run after each step (`reference_timer.py`).
"""
from __future__ import annotations

import time

import torch

from policylab.core.config import ModelConfig
from policylab.dataplane.config import TorchPlaneConfig
from policylab.dataplane.kv_quant import make_kv_backend
from policylab.dataplane.cpu_host import default_threads
from policylab.core.capabilities import Capability
from policylab.core.batch import Batch, StepResult
from policylab.dataplane.cuda_graphs import DecodeGraphRunner, capture_cuda_graph, cuda_graphs_wanted
from policylab.dataplane.model import CausalLM, head_dim_of
from policylab.dataplane.packing import pack
from policylab.dataplane.quant_linear import check_torch_precision, quantize_model
from policylab.dataplane.reference_timer import ReferenceTimer
from policylab.dataplane.sampling import sample
from policylab.dataplane.weights import fuse, load_weights

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CPU_MAX_PARAMS = 2e9       # random float32 weights beyond this would not fit a laptop's RAM


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise ValueError(f"dataplane.device must be auto, cpu or cuda, got '{name}'")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"dataplane.device={name} but torch sees no CUDA device; use device=cpu or auto")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if name not in DTYPES:
        raise ValueError(f"dataplane.dtype must be auto or one of {sorted(DTYPES)}, got '{name}'")
    return DTYPES[name]


def keep_freed_memory() -> None:
    """Stop glibc returning large freed blocks to the OS after every step.

    Each CPU step gathers the paged KV context into fresh tensors of tens of MB; by default
    glibc mmaps and unmaps them, and the page faults can cost as much as the math.
    """
    import ctypes
    import ctypes.util
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is not None and hasattr(libc, "mallopt"):
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        libc.mallopt(M_MMAP_THRESHOLD, 1 << 30)
        libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)


def num_params(cfg: ModelConfig) -> int:
    hd, h = head_dim_of(cfg), cfg.hidden_size
    attn = h * hd * (2 * cfg.num_attention_heads + 2 * cfg.num_key_value_heads)
    per_layer = attn + 3 * h * cfg.intermediate_size
    return cfg.num_hidden_layers * per_layer + cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2)


TORCH_CAPABILITIES = frozenset({Capability.TOKEN_IDS, Capability.KV_BYTES, Capability.KV_CONTENTS,
                                Capability.LOGPROBS, Capability.DRAFTS})


class TorchDataPlane:
    kind = "torch"
    def __init__(self, model: CausalLM, cfg: ModelConfig, dp: TorchPlaneConfig, device: torch.device,
                 dtype: torch.dtype, seed: int, checkpoint: str | None = None):
        self.model, self.cfg, self.dp, self.seed = model, cfg, dp, seed
        self.device, self.dtype = device, dtype
        self.checkpoint = checkpoint           # HF dir with the tokenizer (None for random weights)
        self.vocab_size, self.eos_token_id = cfg.vocab_size, cfg.eos_token_id
        self.capabilities = TORCH_CAPABILITIES
        self.backend = make_kv_backend(dp.attention, device, dp.kv_cache_dtype)
        self.kv_fp8 = dp.kv_cache_dtype == "fp8"
        self.full_precision = None             # a full-precision copy scoring every step (quality.py)
        self.quality = None
        self.use_cuda_graphs = cuda_graphs_wanted(dp.cuda_graphs, device, self.backend)
        self.graphs: DecodeGraphRunner | None = None     # built with the KV cache it reads
        self.kv_caches: list = []
        self.block_size = 0
        self.clock = time.thread_time if dp.timer == "cpu" else time.perf_counter
        self.reference: ReferenceTimer | None = None    # dataplane.timer_reference (allocate_kv builds it)

    def describe_cost_model(self) -> dict:
        """What produced this run's step times (recorded in summary.json)."""
        precision = {k: getattr(self.dp, k) for k in ("weight_dtype", "kv_cache_dtype", "compute_dtype")
                     if getattr(self.dp, k) != "auto"}
        return {"kind": "real", "device": str(self.device), "timer": self.dp.timer,
                "timer_repeats": self.dp.timer_repeats, "timer_reference": self.dp.timer_reference,
                "threads": torch.get_num_threads(), **({"precision": precision} if precision else {})}

    def quality_report(self) -> dict | None:
        """Greedy agreement and logit error against full precision (policylab.dataplane.quality), or None."""
        return None if self.quality is None else self.quality.report()

    @classmethod
    def from_config(cls, dp: TorchPlaneConfig, model: ModelConfig, seed: int) -> "TorchDataPlane":
        if dp.kind != "torch":
            raise ValueError(f"TorchDataPlane built from dataplane.kind='{dp.kind}' (expected torch)")
        device = resolve_device(dp.device)
        if model.source == "random" and device.type == "cpu" and num_params(model) > CPU_MAX_PARAMS:
            raise ValueError(f"model '{model.name}' has {num_params(model) / 1e9:.1f}B parameters: too big "
                             "for the CPU torch data plane; use dataplane=sim or a small model")
        check_torch_precision(dp.weight_dtype, dp.kv_cache_dtype, dp.compute_dtype)
        if dp.quality_reference not in ("auto", "always", "never"):
            raise ValueError(f"dataplane.quality_reference must be auto, always or never, got '{dp.quality_reference}'")
        if dp.timer not in ("wall", "cpu"):
            raise ValueError(f"dataplane.timer must be wall or cpu, got '{dp.timer}'")
        if dp.timer_repeats < 1:
            raise ValueError(f"dataplane.timer_repeats must be >= 1, got {dp.timer_repeats}")
        if dp.timer == "cpu":
            if device.type != "cpu":
                raise ValueError("dataplane.timer=cpu times the CPU thread: on CUDA use timer=wall")
            if dp.threads not in (None, 1):
                raise ValueError(f"dataplane.timer=cpu counts one thread's CPU time: dataplane.threads must be "
                                 f"1 or null, got {dp.threads}")
            torch.set_num_threads(1)
        elif dp.timer_repeats != 1 or dp.timer_reference:
            raise ValueError("dataplane.timer_repeats and dataplane.timer_reference apply to dataplane.timer=cpu")
        elif dp.threads:
            torch.set_num_threads(dp.threads)
        elif device.type == "cpu" and default_threads() is not None:
            torch.set_num_threads(default_threads())
        if device.type == "cpu":
            keep_freed_memory()
        dtype = resolve_dtype(dp.dtype, device)
        cfg, sd, path = load_weights(model, seed)
        with torch.device("meta"):           # no throw-away init of the full model
            net = CausalLM(cfg)
        net = net.to_empty(device=device).to(dtype)
        net.finish_init(device)
        missing, unexpected = net.load_state_dict(fuse(sd, cfg), strict=False)
        if [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")] or unexpected:
            raise ValueError(f"model '{cfg.name}': checkpoint does not match the architecture "
                             f"(missing {missing[:4]}, unexpected {unexpected[:4]})")
        if dp.weight_dtype != "auto":
            quantize_model(net, dp.weight_dtype, dp.compute_dtype)
        plane = cls(net.eval(), cfg, dp, device, dtype, seed, path)
        quantised = any(getattr(dp, k) != "auto" for k in ("weight_dtype", "kv_cache_dtype", "compute_dtype"))
        if dp.quality_reference == "always" or (dp.quality_reference == "auto" and quantised):
            from dataclasses import replace
            from policylab.dataplane.quality import QualityMeter
            plane.full_precision = cls.from_config(replace(dp, weight_dtype="auto", kv_cache_dtype="auto",
                                                           compute_dtype="auto", quality_reference="never",
                                                           timer_reference=False), model, seed)
            plane.quality = QualityMeter()
        return plane

    # ------------------------------------------------------------------ KV
    def _block_bytes(self, block_size: int) -> int:
        c = self.cfg
        if self.kv_fp8:                     # FP8 values and a float32 scale per token and head (kv_quant.py)
            from policylab.dataplane.kv_quant import row_width
            return 2 * c.num_hidden_layers * block_size * c.num_key_value_heads * row_width(head_dim_of(c))
        return 2 * c.num_hidden_layers * block_size * c.num_key_value_heads * head_dim_of(c) * \
            torch.finfo(self.dtype).bits // 8

    def num_kv_blocks(self, block_size: int) -> int:
        per_block = self._block_bytes(block_size)
        if self.device.type == "cpu":
            budget = self.dp.kv_cache_gb * 1e9
        else:
            free, total = torch.cuda.mem_get_info(self.device)
            budget = free - total * (1 - self.dp.gpu_memory_utilization)
        n = int(budget // per_block)
        if n < 1:
            raise ValueError(f"no room for a single KV block ({per_block} bytes) with the configured "
                             f"budget ({budget / 1e9:.3f} GB); raise dataplane.kv_cache_gb / "
                             "gpu_memory_utilization")
        if self.device.type == "cuda":
            print(f"[policylab] KV cache: {n} blocks x {block_size} tokens = {n * per_block / 1e9:.2f} GB "
                  f"(gpu_memory_utilization={self.dp.gpu_memory_utilization}, after weights)")
        return n

    def _new_kv(self, num_blocks: int, block_size: int) -> tuple:
        """(the cache tensor, per-layer (k, v) views) in the backend's memory order."""
        c = self.cfg
        kvh, hd = c.num_key_value_heads, head_dim_of(c)
        if self.kv_fp8:                     # packed uint8 rows of FP8 values and their scale (kv_quant.py)
            from policylab.dataplane.kv_quant import row_width
            kv = torch.zeros(2, c.num_hidden_layers, kvh, num_blocks, block_size, row_width(hd),
                             device=self.device, dtype=torch.uint8)
            views = kv.permute(0, 1, 3, 4, 2, 5)
            return kv, [(views[0, i], views[1, i]) for i in range(c.num_hidden_layers)]
        if self.backend.kv_layout == "head_major":
            kv = torch.zeros(2, c.num_hidden_layers, kvh, num_blocks, block_size, hd,
                             device=self.device, dtype=self.dtype)
            views = kv.permute(0, 1, 3, 4, 2, 5)
        else:
            kv = views = torch.zeros(2, c.num_hidden_layers, num_blocks, block_size, kvh, hd,
                                     device=self.device, dtype=self.dtype)
        return kv, [(views[0, i], views[1, i]) for i in range(c.num_hidden_layers)]

    @torch.inference_mode()
    def _reference_forward(self, packed, kv_caches) -> None:
        self.model(packed, kv_caches, self.backend, False)

    def allocate_kv(self, num_blocks: int, block_size: int) -> None:
        """One allocation; per-layer (k, v) views of flash-attn's paged shape [blocks, block_size,
        kv_heads, head_dim]. Memory order is the backend's: block-major for flash_attn, head-major
        ([kv_heads, blocks, block_size, head_dim] underneath) for the torch backend."""
        self.kv, self.kv_caches = self._new_kv(num_blocks, block_size)
        self.block_size = block_size
        if self.full_precision is not None:
            self.full_precision.allocate_kv(num_blocks, block_size)
        if self.dp.timer_reference:
            self.reference = ReferenceTimer(self._reference_forward, lambda n: self._new_kv(n, block_size)[1],
                                            block_size, self.clock)
        if self.use_cuda_graphs:
            max_len = min(self.cfg.max_position_embeddings, num_blocks * block_size)
            with torch.inference_mode():
                self.graphs = DecodeGraphRunner(self.model, self.kv_caches, self.backend, block_size, max_len,
                                                self.device, capture_cuda_graph(torch.cuda.graph_pool_handle()))

    def kv_block_bytes(self, block_size: int) -> int:
        """Bytes one KV block of this cache holds (what a swap moves per block)."""
        return self._block_bytes(block_size)

    def _block_dim(self) -> int:
        """The block axis of `self.kv` (its memory order is the backend's, see `_new_kv`)."""
        return 3 if self.backend.kv_layout == "head_major" else 2

    @torch.inference_mode()
    def export_kv(self, block_table: list) -> torch.Tensor:
        """A copy of the K/V in these blocks, in table order (a P/D handoff's payload: taken when
        the prefill replica finishes the request, before its blocks are freed for reuse)."""
        index = torch.tensor(block_table, dtype=torch.long, device=self.device)
        return self.kv.index_select(self._block_dim(), index)

    @torch.inference_mode()
    def import_kv(self, block_table: list, payload: torch.Tensor, first: int = 0) -> None:
        """Write an exported payload into these blocks of this plane's cache (the decode replica's
        side of a P/D transfer: same model shape, same block size, as many blocks; a swap-in:
        the payload's blocks from `first` on, those before it still cached on the device)."""
        dim = self._block_dim()
        if first:
            payload = payload.narrow(dim, first, payload.shape[dim] - first)
        if payload.shape[dim] != len(block_table) or payload.shape[:dim] != self.kv.shape[:dim] or \
                payload.shape[dim + 1:] != self.kv.shape[dim + 1:]:
            raise ValueError(f"KV payload of shape {tuple(payload.shape)} does not fit {len(block_table)} "
                             f"blocks of a cache shaped {tuple(self.kv.shape)} (block axis {dim})")
        index = torch.tensor(block_table, dtype=torch.long, device=self.device)
        self.kv.index_copy_(dim, index, payload.to(self.device, self.kv.dtype))
        if self.quality is not None:            # (a quantised payload the reference cannot mirror)
            self.quality.stop(f"a KV import (swap-in or P/D) after {self.quality.positions} positions")

    @torch.inference_mode()
    def copy_kv_blocks(self, src: list, dst: list) -> None:
        """Copy the K/V of blocks `src` into blocks `dst` (pairwise): a fork's copy-on-write of a
        block its samples shared, before the step that writes it."""
        dim = self._block_dim()
        index = torch.tensor(src, dtype=torch.long, device=self.device)
        self.kv.index_copy_(dim, torch.tensor(dst, dtype=torch.long, device=self.device),
                            self.kv.index_select(dim, index))
        if self.full_precision is not None:
            self.full_precision.copy_kv_blocks(src, dst)

    @torch.inference_mode()
    def sampled_logprobs(self, rows: list, tokens: list) -> list:
        """Log-probabilities of `tokens` at rows `rows` of the last step's sampled entries (the
        model's distribution, before temperature): beam search's scores."""
        logits = self._last_logits[torch.tensor(rows, dtype=torch.long, device=self._last_logits.device)]
        logp = torch.log_softmax(logits.float(), dim=-1)
        return logp[torch.arange(len(rows), device=logp.device),
                    torch.tensor(tokens, dtype=torch.long, device=logp.device)].tolist()

    # ---------------------------------------------------------------- step
    @torch.inference_mode()
    def forward(self, batch: Batch, all_logits: bool = False) -> torch.Tensor:
        """Logits of the sampled entries (or of every token): for tests and tools."""
        if not self.kv_caches:
            raise RuntimeError("allocate_kv must be called before the first step")
        if self.graphs is not None and self.graphs.accepts(batch):
            return self.graphs.run(batch, all_logits)
        packed = pack(batch, self.block_size, self.device)
        return self.model(packed, self.kv_caches, self.backend, all_logits)

    def execute(self, batch: Batch) -> StepResult:
        result = self._execute_once(batch)
        if self.quality is not None:            # the reference writes its KV and scores (outside the step's timing)
            reference = self.full_precision.forward(batch)
            if batch.spec_lens is None:         # (a verification's rows are not next-token samples)
                self.quality.score(self._last_logits, reference)
        for _ in range(self.dp.timer_repeats - 1):      # same batch, same outcome: keep the least time
            again = self._execute_once(batch)
            if again.duration < result.duration:
                result = again
        if self.reference is not None:                 # the machine's current speed divided out
            result = StepResult(result.sampled, result.duration * self.reference.factor(), result.accepted)
        return result

    def _execute_once(self, batch: Batch) -> StepResult:
        if batch.spec_lens is not None:              # drafts to verify, greedily
            from policylab.dataplane.speculative import verify_greedy
            result, self._last_logits = verify_greedy(self, batch)    # (the rows its tokens were sampled from)
            return result
        start = self.clock()
        logits = self.forward(batch)
        self._last_logits = logits              # (a reference: beam search may ask its log-probabilities)
        rows = [i for i, s in enumerate(batch.sample) if s]
        tokens = sample(logits, [batch.sampling[i] for i in rows], [batch.req_ids[i] for i in rows],
                        [batch.context_lens[i] + batch.query_lens[i] for i in rows], self.seed)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return StepResult(tokens, self.clock() - start)
