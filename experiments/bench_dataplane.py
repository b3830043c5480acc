"""Offline throughput of the torch data plane inside the engine vs HF transformers `generate`.

Same weights (a seeded random model of configs/model/<--model>.yaml, tiny by default), same
prompt ids: N requests of P prompt tokens, all arriving at t=0, each generating O tokens
(greedy, no EOS stop); with --output-spread s, request i generates a length drawn uniformly
in O*(1-s)..O*(1+s).
  ours: Engine + PrefillFirst + TorchDataPlane (paged KV, continuous batching)
  hf:   LlamaForCausalLM.generate, static batches of --hf-batch prompts (default: all at once,
        the best case for it); a batch runs until its longest request is done.
Both run --repeats times, alternating; the best run of each counts (a shared machine's load
comes and goes). Prints useful output tokens/s (wall clock, and per CPU-second of this
process, steadier under contention) and the ratios, plus single-step times (a decode batch
and a long prefill) that size the default CPU run.

    .venv/bin/python experiments/bench_dataplane.py [--requests 64 --prompt 128 --output 128]
    python experiments/bench_dataplane.py --device cuda --model qwen2-0.5b \
        --planes torch,triton,triton+graphs                                   # on a GPU (bf16)
--planes compares several planes (attention backend, CUDA-graph decodes) against one HF run.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from policies.prefill_first import PrefillFirst
from policylab.core.config import EngineConfig, ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.core.batch import Batch
from policylab.dataplane.torch_plane import TorchDataPlane
from policylab.dataplane.weights import random_state_dict, to_hf_config
from policylab.core.engine import Engine
from policylab.core.request import SamplingParams, TraceRequest

ROOT = Path(__file__).resolve().parents[1]


def model_config(name: str) -> ModelConfig:
    """A shipped model config with seeded random weights (shape-only configs too)."""
    fields = OmegaConf.to_container(OmegaConf.load(ROOT / f"configs/model/{name}.yaml"))
    return ModelConfig(**{**fields, "source": "random", "path": None})


def output_lengths(args) -> list:
    rng = np.random.default_rng(0)
    lo, hi = round(args.output * (1 - args.output_spread)), round(args.output * (1 + args.output_spread))
    return rng.integers(max(lo, 1), hi + 1, args.requests).tolist()


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def run_ours(plane, lengths, args) -> tuple:
    trace = [TraceRequest(arrival_time=0.0, prompt_tokens=args.prompt, output_tokens=n) for n in lengths]
    cfg = EngineConfig(max_num_batched_tokens=args.budget, max_num_seqs=args.requests,
                       num_blocks=sum(-(-(args.prompt + n) // 16) for n in lengths))
    engine = Engine(trace, PrefillFirst(watermark=0.0), plane, cfg, seed=0)   # as its published figures
    wall, cpu, result = timed(engine.run)
    assert result.status == "complete", result.error
    return wall, cpu, [r.prompt_ids for r in result.requests], [r.output_ids for r in result.requests]


def hf_model(model_cfg, plane):
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_config(to_hf_config(model_cfg)).eval()
    hf.load_state_dict(random_state_dict(model_cfg, 0), strict=False)
    return hf.to(device=plane.device, dtype=plane.dtype)


def run_hf(hf, prompts, lengths, args) -> tuple:
    def generate():
        outputs = []
        for i in range(0, len(prompts), args.hf_batch):
            ids = torch.as_tensor(np.stack(prompts[i:i + args.hf_batch]), dtype=torch.long,
                                  device=hf.device)                                   # equal lengths
            n = max(lengths[i:i + args.hf_batch])
            with torch.inference_mode():
                out = hf.generate(ids, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                                  eos_token_id=None, pad_token_id=0)
            new = out[:, ids.shape[1]:].tolist()
            outputs += [row[:m] for row, m in zip(new, lengths[i:i + args.hf_batch])]
        return outputs
    return timed(generate)


def step_time(plane, batch: Batch, repeats: int = 10) -> float:
    plane.execute(batch)                                             # warm-up
    return statistics.median(plane.execute(batch).duration for _ in range(repeats))


def step_times(plane, args) -> None:
    bs, ctx, rng = 16, args.prompt, np.random.default_rng(0)
    per_req = -(-(ctx + 1) // bs)
    decode = Batch()
    for i in range(32):
        decode.req_ids.append(i)
        decode.query_lens.append(1)
        decode.context_lens.append(ctx)
        decode.block_tables.append(list(range(i * per_req, (i + 1) * per_req)))
        decode.token_ids.append(rng.integers(16, 1000, 1).astype(np.int32))
        decode.sample.append(True)
        decode.sampling.append(SamplingParams())
    prefill = Batch([0], [512], [0], [list(range(512 // bs))], [rng.integers(16, 1000, 512).astype(np.int32)],
                    [True], [SamplingParams()])
    print(f"step time, decode batch of 32 (context {ctx}): {step_time(plane, decode) * 1e3:.1f} ms")
    print(f"step time, one 512-token prefill:             {step_time(plane, prefill) * 1e3:.1f} ms")


def plane_config(name: str, args) -> DataplaneConfig:
    """--planes entries: torch | triton | flash_attn, with +graphs for CUDA-graph decodes."""
    attention, _, graphs = name.partition("+")
    if attention not in ("torch", "triton", "flash_attn") or graphs not in ("", "graphs"):
        raise SystemExit(f"--planes: unknown plane '{name}' (torch, triton, triton+graphs, flash_attn)")
    return DataplaneConfig(device=args.device, dtype=args.dtype, threads=args.threads, attention=attention,
                           cuda_graphs=bool(graphs))


def environment(plane) -> str:
    where = f"{torch.cuda.get_device_name(plane.device)} (CUDA {torch.version.cuda})" \
        if plane.device.type == "cuda" else f"{torch.get_num_threads()} CPU threads"
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    import transformers
    return (f"torch {torch.__version__}, triton {triton_version}, transformers {transformers.__version__} "
            f"on {where}, {plane.dtype}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--output-spread", type=float, default=0.0, help="output lengths O*(1 +- s)")
    ap.add_argument("--hf-batch", type=int, default=None, help="HF static batch size (default: all)")
    ap.add_argument("--budget", type=int, default=2048, help="engine max_num_batched_tokens")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--model", default="tiny", help="configs/model/NAME.yaml, with random weights")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    ap.add_argument("--dtype", default="auto", help="auto: float32 on CPU, bfloat16 on CUDA")
    ap.add_argument("--planes", default="torch",
                    help="comma-separated planes to compare with HF: torch, triton, triton+graphs (CUDA)")
    ap.add_argument("--repeats", type=int, default=2, help="alternating runs of each; the best counts")
    args = ap.parse_args()
    args.hf_batch = args.hf_batch or args.requests
    model_cfg = model_config(args.model)
    planes = {name: TorchDataPlane.from_config(plane_config(name, args), model_cfg, 0)
              for name in args.planes.split(",")}
    first = next(iter(planes.values()))
    m = model_cfg
    print(f"{environment(first)}; model {m.name} (random weights): hidden {m.hidden_size}, "
          f"{m.num_hidden_layers} layers, vocab {m.vocab_size}")
    lengths, hf = output_lengths(args), hf_model(model_cfg, first)
    ours, theirs = {name: [] for name in planes}, []
    for _ in range(args.repeats):
        for name, plane in planes.items():
            ours[name].append(run_ours(plane, lengths, args))
        theirs.append(run_hf(hf, ours[next(iter(planes))][-1][2], lengths, args))
    tokens = sum(lengths)
    hf_wall, hf_cpu = min(r[0] for r in theirs), min(r[1] for r in theirs)
    print(f"{args.requests} requests x {args.prompt} prompt x {args.output} (+-{args.output_spread:.0%}) "
          f"output tokens = {tokens} useful output tokens; best of {args.repeats} runs")
    print(f"{f'hf generate (static, batch {args.hf_batch})':38s} wall {hf_wall:7.2f} s {tokens / hf_wall:7.0f} tok/s"
          f" | cpu {hf_cpu:7.2f} s {tokens / hf_cpu:7.0f} tok/cpu-s")
    for name, runs in ours.items():
        wall, cpu = min(r[0] for r in runs), min(r[1] for r in runs)
        same = sum(a == b for a, b in zip(runs[0][3], theirs[0][2]))
        print(f"{f'ours: {name}':38s} wall {wall:7.2f} s {tokens / wall:7.0f} tok/s | cpu {cpu:7.2f} s "
              f"{tokens / cpu:7.0f} tok/cpu-s | {hf_wall / wall:.2f}x hf (cpu {hf_cpu / cpu:.2f}x); "
              f"identical greedy outputs: {same}/{args.requests}")
    for name, plane in planes.items():
        print(f"-- {name}")
        plane.allocate_kv(64 * -(-(args.prompt + 1) // 16), 16)
        step_times(plane, args)


if __name__ == "__main__":
    main()
