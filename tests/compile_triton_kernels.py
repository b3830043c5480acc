"""Compile the triton backend's kernels, exactly as a mixed step launches them, for an sm_90 GPU
(H100/H200) without one: Triton lowers them and its bundled ptxas assembles the cubin.

    python -m tests.compile_triton_kernels bfloat16 float32     # one line per dtype and kernel

tests/test_triton_attention.py runs this in a fresh process without TRITON_INTERPRET: under the
interpreter Triton's own standard library (tl.max, tl.sum) is built as interpreted functions,
which the GPU compiler cannot lower. Here the launches are recorded, not run.
"""
from __future__ import annotations

import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane import triton_kernels as kernels
from policylab.core.batch import Batch
from policylab.dataplane.triton_attention import TritonAttention
from policylab.dataplane.torch_plane import TorchDataPlane
from tests.test_dataplane_model import BS, SMALL, entry, ids

POINTERS = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.int32: "*i32",
            torch.int64: "*i64"}
LAUNCH_OPTIONS = ("num_warps", "num_stages")
KERNELS = ("_store_kv_kernel", "_decode_kernel", "_prefill_kernel")


def recorded_launches(dtype: str) -> dict:
    """kernel name -> (kernel, args, kwargs) of its first launch in a step with a chunk after
    context, a fresh prompt and a decode."""
    launches = {}

    class Recorder:
        def __init__(self, name):
            self.name, self.kernel = name, getattr(kernels, name)

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.setdefault(self.name, (self.kernel, args, kwargs))

    originals = {name: getattr(kernels, name) for name in KERNELS}
    for name in KERNELS:
        setattr(kernels, name, Recorder(name))
    try:
        plane = TorchDataPlane.from_config(DataplaneConfig(device="cpu", dtype=dtype), SMALL, 0)
        plane.backend = TritonAttention(torch.device("cuda"))    # the GPU tile sizes; nothing runs
        plane.allocate_kv(16, BS)
        plane.forward(entry(entry(entry(Batch(), 0, ids(9, 1), 4, [1, 2, 3, 4]), 1, ids(6, 2), 0, [5, 6]),
                            2, [7], 10, [7, 8, 9]))
    finally:
        for name, kernel in originals.items():
            setattr(kernels, name, kernel)
    return launches


def compile_for_sm90(dtype_name: str) -> None:
    dtype = getattr(torch, dtype_name)
    for name, (kernel, args, kwargs) in recorded_launches(dtype_name).items():
        signature = {arg: POINTERS[x.dtype] if isinstance(x, torch.Tensor) else
                     "fp32" if isinstance(x, float) else "i32" for arg, x in zip(kernel.arg_names, args)}
        constants = {k: v for k, v in kwargs.items() if k not in LAUNCH_OPTIONS}
        if "DOT_DTYPE" in constants:
            constants["DOT_DTYPE"], constants["PRECISION"] = kernels.dot_types(dtype, interpreted=False)
        signature.update({k: "constexpr" for k in constants})
        compiled = triton.compile(ASTSource(kernel, signature, constexprs=constants), target=GPUTarget("cuda", 90, 32),
                                  options={k: v for k, v in kwargs.items() if k in LAUNCH_OPTIONS})
        assert compiled.asm["cubin"], name
        print(f"{dtype_name} {name}: sm_90 cubin, {compiled.metadata.shared} bytes shared memory")


if __name__ == "__main__":
    for name in sys.argv[1:]:
        compile_for_sm90(name)
