"""`fidelity-e2e` on `vllm bench serve --max-concurrency N --request-rate inf` results kept as summaries.

A session of `experiments/cpu_vllm_e2e.py` holds its decode probes: real runs of N concurrent streams
(`--max-concurrency` 4 and 16 at an unlimited rate, 256 + 64 tokens, `--save-detailed`), its fit and the
server's terms (`server_terms.json`). Each probe is replayed three ways: from its per-request records (the
send times as they were), and from its summary alone (the lists dropped, as a result saved without
`--save-detailed`): by N closed-loop users, as `fidelity-e2e` reads such a summary, and with every request
at once, as it read one before. Printed: each way's error in TTFT, E2E and per-token interval (mean and
range over the session's four probe sets).

    python experiments/cpu_vllm_closed_loop.py SESSION_DIR
"""
from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from policylab.apps import fidelity_e2e

KNOBS = ["--block-size=32", "--max-num-seqs=16", "--max-num-batched-tokens=512", "--max-model-len=2048"]
METRICS = ("ttft_mean", "e2e_mean", "per_token_interval")


def replay(path: Path, session: Path, terms: dict):
    """fidelity-e2e's comparison of one result (its printout swallowed)."""
    args = fidelity_e2e.build_parser().parse_intermixed_args(
        [str(path), "--model", "tiny", "--gpu", "cpu", *KNOBS, f"--client-latency={terms['client_latency']}",
         f"--host-per-step={terms['host_per_step']}", f"--host-per-request={terms['host_per_request']}",
         f"dataplane.calibration={session / 'calibrate' / 'calibration.json'}"])
    with contextlib.redirect_stdout(io.StringIO()):
        return fidelity_e2e.run(args)[0]


def main(argv=None) -> int:
    session = Path((argv or sys.argv[1:])[0])
    terms = json.loads((session / "server_terms.json").read_text())
    errors: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for users in (4, 16):
            for probe in sorted(session.glob(f"decode_{users}_*.json")):
                raw = json.loads(probe.read_text())
                summary = {k: v for k, v in raw.items() if not isinstance(v, list)}
                ways = {"per-request records": probe}
                for way, cap in (("summary, closed loop", users), ("summary, all at once", None)):
                    ways[way] = Path(tmp) / f"{way[-4:]}.json"
                    ways[way].write_text(json.dumps(dict(summary, max_concurrency=cap)))
                for way, path in ways.items():
                    row = replay(path, session, terms)
                    for key in METRICS:
                        errors.setdefault((users, way, key), []).append(row.errors[key])
    print("| streams | replayed from | TTFT | E2E | per-token interval |\n|---|---|---|---|---|")
    for users in (4, 16):
        for way in ("per-request records", "summary, closed loop", "summary, all at once"):
            cells = [errors[users, way, key] for key in METRICS]
            print(f"| {users} | {way} | " + " | ".join(
                f"{np.mean(e) * 100:+.1f} % ({min(e) * 100:+.1f}…{max(e) * 100:+.1f})" for e in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
