"""Step times with the machine's current speed divided out (`dataplane.timer_reference=true`).

On a shared CPU the thread's CPU time of the same work still moves with its neighbours: they
share the caches and the memory bandwidth, and two back-to-back replays differed by ~10 % in
their median decode step. Here each step is followed by one run of a fixed reference step (the
same model, a fixed batch of decodes and a prefill chunk, on a KV cache of its own), and the
step's time is scaled by best / now: `best` is the reference's least time over a calibration at
the start, `now` its least over the last few steps. When neighbours slow every step by x %, the
reference slows by about as much and the ratio cancels it; noise in the reference itself is
damped by the least-of-window. It costs one reference run per step (a small decode step).
What it cannot remove: a slowdown that hits the step and not the reference (or the reverse).
"""
from __future__ import annotations

from collections import deque

import numpy as np
import torch

from policylab.core.batch import Batch
from policylab.core.request import SamplingParams
from policylab.dataplane.packing import pack

CALIBRATION_RUNS = 30     # reference runs at the start: their least time is `best`
WINDOW = 8                # `now` is the least of the last WINDOW reference runs
DECODES, CONTEXT, CHUNK = 8, 48, 32     # the reference batch: 8 decodes at context 48 + a 32-token chunk


class ReferenceTimer:
    def __init__(self, run_forward, make_kv, block_size: int, clock):
        """`run_forward(batch, kv_caches)` runs one forward; `make_kv(num_blocks)` a KV cache of its own."""
        per = -(-(CONTEXT + CHUNK + 1) // block_size)
        entries = DECODES + 1
        self.kv = make_kv(entries * per)
        self.batch = Batch(list(range(entries)), [1] * DECODES + [CHUNK], [CONTEXT] * DECODES + [0],
                           [list(range(i * per, (i + 1) * per)) for i in range(entries)],
                           [np.array([7], np.int32)] * DECODES + [np.arange(16, 16 + CHUNK, dtype=np.int32)],
                           [True] * entries, [SamplingParams()] * entries)
        self.block_size, self.run_forward, self.clock = block_size, run_forward, clock
        self.best = min(self._run() for _ in range(CALIBRATION_RUNS))
        self.recent = deque(maxlen=WINDOW)

    def _run(self) -> float:
        start = self.clock()
        self.run_forward(pack(self.batch, self.block_size, torch.device("cpu")), self.kv)
        return self.clock() - start

    def factor(self) -> float:
        """best / now after one more reference run: < 1 while neighbours slow the machine down."""
        self.recent.append(self._run())
        return self.best / min(self.recent)
