"""What a precision costs in quality, on the real plane: a full-precision copy of the model scores
every step of a quantised replay (`dataplane.quality_reference`, on by default when a dtype is
quantised).

The reference is the same model at the plane's dtype (same weights, its own KV cache written by
the same batches), so both see exactly the tokens the quantised run produced (teacher forcing):
a disagreement at one position does not carry into the next. At every sampled row it compares
the two next-token distributions:

- greedy agreement: the argmax is the same token;
- logit error: rms(quantised − reference logits) / rms(reference logits), pooled, and the
  largest |difference|;
- KL(reference ‖ quantised) of the softmaxed logits, mean over positions.

A KV import (swap-in, P/D) writes a quantised payload the reference cannot mirror: scoring stops
there and the report says after how many positions (`quality.stopped`).
"""
from __future__ import annotations

import torch


class QualityMeter:
    def __init__(self):
        self.positions = self.agree = 0
        self.diff_sq = self.ref_sq = self.kl = 0.0
        self.max_error = 0.0
        self.stopped: str | None = None

    def score(self, logits: torch.Tensor, reference: torch.Tensor) -> None:
        """One step's sampled rows: [rows, vocab] of the quantised plane and of the reference."""
        if self.stopped or not len(logits):
            return
        a, b = logits.float(), reference.float()
        diff = a - b
        self.positions += len(a)
        self.agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        self.diff_sq += float(diff.square().sum())
        self.ref_sq += float(b.square().sum())
        self.max_error = max(self.max_error, float(diff.abs().max()))
        log_p, log_q = torch.log_softmax(b, -1), torch.log_softmax(a, -1)
        self.kl += float((log_p.exp() * (log_p - log_q)).sum())

    def stop(self, why: str) -> None:
        if self.stopped is None:
            self.stopped = why

    def report(self) -> dict | None:
        if not self.positions:
            return None
        out = {"positions": self.positions, "greedy_agreement": self.agree / self.positions,
               "logit_rmse": (self.diff_sq / self.ref_sq) ** 0.5 if self.ref_sq else None,
               "max_logit_error": self.max_error, "kl_divergence": self.kl / self.positions}
        if self.stopped:
            out["stopped"] = self.stopped
        return out
