"""`dataplane.timer=cpu`: a real-plane step is timed by its thread's CPU time, so time the step
spends off the CPU (other processes running, sleeping) is not counted; wall time counts it."""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from policylab.core.batch import Batch
from policylab.core.config import ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.core.request import SamplingParams
from policylab.dataplane.torch_plane import TorchDataPlane

SMALL = ModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=512)


@pytest.fixture
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def plane_with_a_sleeping_step(timer: str) -> tuple:
    plane = TorchDataPlane.from_config(DataplaneConfig(device="cpu", dtype="float32", timer=timer), SMALL, 0)
    plane.allocate_kv(8, 16)
    forward = plane.forward

    def sleepy_forward(batch, all_logits=False):
        time.sleep(0.3)                       # off the CPU, as when a neighbour holds the core
        return forward(batch, all_logits)
    plane.forward = sleepy_forward
    batch = Batch([0], [5], [0], [[0]], [np.arange(16, 21, dtype=np.int32)], [True], [SamplingParams()])
    return plane, batch


def test_cpu_timer_leaves_out_time_off_the_cpu(keep_threads):
    plane, batch = plane_with_a_sleeping_step("cpu")
    assert torch.get_num_threads() == 1
    assert plane.execute(batch).duration < 0.15
    assert plane.describe_cost_model() == {"kind": "real", "device": "cpu", "timer": "cpu", "timer_repeats": 1,
                                           "timer_reference": False, "threads": 1}
    wall, batch = plane_with_a_sleeping_step("wall")
    assert wall.execute(batch).duration >= 0.3


def test_bad_timer_settings_are_refused(keep_threads):
    with pytest.raises(ValueError, match="dataplane.timer must be wall or cpu"):
        TorchDataPlane.from_config(DataplaneConfig(device="cpu", timer="gpu"), SMALL, 0)
    with pytest.raises(ValueError, match="dataplane.threads must be 1 or null, got 2"):
        TorchDataPlane.from_config(DataplaneConfig(device="cpu", timer="cpu", threads=2), SMALL, 0)


def test_repeats_keep_the_least_cpu_time_and_the_same_tokens(keep_threads):
    plane = TorchDataPlane.from_config(DataplaneConfig(device="cpu", dtype="float32", timer="cpu",
                                                       timer_repeats=3), SMALL, 0)
    plane.allocate_kv(8, 16)
    forward, spins = plane.forward, iter([0.08, 0.0, 0.05])

    def busy_forward(batch, all_logits=False):
        end = time.thread_time() + next(spins)          # CPU work a disturbed repeat would add
        while time.thread_time() < end:
            pass
        return forward(batch, all_logits)
    plane.forward = busy_forward
    batch = Batch([0], [5], [0], [[0]], [np.arange(16, 21, dtype=np.int32)], [True], [SamplingParams()])
    result = plane.execute(batch)
    assert result.duration < 0.05      # any disturbed repeat costs at least its 0.05 s of spin
    plane.forward = forward
    assert result.sampled == plane.execute(batch).sampled
    with pytest.raises(ValueError, match="timer_reference apply to dataplane.timer=cpu"):
        TorchDataPlane.from_config(DataplaneConfig(device="cpu", timer_repeats=2), SMALL, 0)
    with pytest.raises(ValueError, match="timer_reference apply to dataplane.timer=cpu"):
        TorchDataPlane.from_config(DataplaneConfig(device="cpu", timer_reference=True), SMALL, 0)


class SlowingMachine:
    """A fake CPU clock: work of u units takes u x slowdown seconds (neighbours slow it down)."""

    def __init__(self):
        self.now, self.slowdown = 0.0, 1.0

    def clock(self) -> float:
        return self.now

    def work(self, units: float) -> None:
        self.now += units * self.slowdown


def test_the_reference_divides_out_a_machine_wide_slowdown():
    from policylab.dataplane.reference_timer import WINDOW, ReferenceTimer
    machine = SlowingMachine()
    timer = ReferenceTimer(lambda packed, kv: machine.work(1.0), lambda n: None, 16, machine.clock)

    def step(units: float) -> float:          # a step measured as the plane does, then scaled
        start = machine.clock()
        machine.work(units)
        return (machine.clock() - start) * timer.factor()

    quiet = [step(10.0) for _ in range(WINDOW)]
    machine.slowdown = 1.3                     # a neighbour starts: every step 30 % slower
    slowed = [step(10.0) for _ in range(3 * WINDOW)]
    assert quiet == [10.0] * WINDOW
    assert slowed[WINDOW:] == pytest.approx([10.0] * (2 * WINDOW))   # once the window has seen it
    assert max(slowed) <= 13.0 + 1e-9          # never worse than unscaled


def test_a_plane_with_the_reference_timer_steps_and_says_so(keep_threads):
    plane = TorchDataPlane.from_config(DataplaneConfig(device="cpu", dtype="float32", timer="cpu",
                                                       timer_reference=True), SMALL, 0)
    plane.allocate_kv(8, 16)
    batch = Batch([0], [5], [0], [[0]], [np.arange(16, 21, dtype=np.int32)], [True], [SamplingParams()])
    assert plane.execute(batch).duration > 0        # (no upper bound: it would be this machine's speed)
    assert plane.describe_cost_model()["timer_reference"] is True
