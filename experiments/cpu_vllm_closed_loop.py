"""`fidelity-e2e` on `vllm bench serve --max-concurrency N` results kept as summaries.

A session of `experiments/cpu_vllm_e2e.py` holds its decode probes: real runs of N concurrent streams
(`--max-concurrency` 4 and 16 at an unlimited rate, 256 + 64 tokens, `--save-detailed`), its fit and the
server's terms (`server_terms.json`); a session run with `--max-concurrency N` also its workload runs,
capped at a finite rate. Each is replayed three ways: from its per-request records (the send times as
they were), and from its summary alone (the lists dropped, as a result saved without `--save-detailed`):
with at most N requests in flight, as `fidelity-e2e` reads such a summary (each request at its arrival
time or a client round trip after another finished: at an unlimited rate, N closed-loop users), and
with its cap ignored (every request at its drawn arrival time; at an unlimited rate, all at once).
Printed: each way's error in TTFT, E2E and per-token interval (mean and range over the runs); for a
workload whose clients gave up after a timeout (`--client-timeout`), replayed with the same timeout,
also in the requests given up on.

    python experiments/cpu_vllm_closed_loop.py SESSION_DIR
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from cpu_vllm_e2e import METRICS as LABELLED, fidelity_e2e, replay_args

METRICS = tuple(key for key, _ in LABELLED)


def replay(path: Path, session: Path, terms: dict, prefix_len: int, timeout: float | None = None):
    """fidelity-e2e's comparison of one result, as the session's own comparison runs it (printout swallowed;
    `timeout`: its clients gave up after that many seconds)."""
    return fidelity_e2e(replay_args(path, terms, session / "calibrate" / "calibration.json", prefix_len,
                                    *([f"--client-timeout={timeout}"] if timeout else [])), quiet=True)[0]


def workload(session: Path) -> tuple[int, float | None]:
    """(the tokens every prompt of the session's workload shared: its `--random-prefix-len`, the seconds
    after which its clients gave up on a request or None); the probes share none and never give up."""
    saved = json.loads((session / "workload.json").read_text())
    args = saved["args"]
    return int(args[args.index("--random-prefix-len") + 1]), saved.get("client_timeout")


def main(argv=None) -> int:
    session = Path((argv or sys.argv[1:])[0])
    terms = json.loads((session / "server_terms.json").read_text())
    errors: dict = {}
    groups = {f"{n} streams": sorted(session.glob(f"decode_{n}_*.json")) for n in (4, 16)}
    capped = [p for p in sorted(session.glob("run_*.json")) if json.loads(p.read_text()).get("max_concurrency")]
    if capped:
        first = json.loads(capped[0].read_text())
        groups[f"workload, cap {first['max_concurrency']} at {first['request_rate']:g} req/s"] = capped
    ways = ("per-request records", "summary, capped", "summary, cap ignored")
    with tempfile.TemporaryDirectory() as tmp:
        for group, results in groups.items():
            for result in results:
                raw = json.loads(result.read_text())
                summary = {k: v for k, v in raw.items() if not isinstance(v, list)}
                paths = {ways[0]: result}
                for way, cap in ((ways[1], raw["max_concurrency"]), (ways[2], None)):
                    paths[way] = Path(tmp) / f"{way[-7:].strip()}.json"
                    paths[way].write_text(json.dumps(dict(summary, max_concurrency=cap)))
                shared, timeout = workload(session) if result.name.startswith("run_") else (0, None)
                for way, path in paths.items():
                    row = replay(path, session, terms, shared, timeout)
                    for key in METRICS:
                        errors.setdefault((group, way, key), []).append(row.errors[key])
                    if timeout:          # the requests given up on: the replay's against the measured
                        errors.setdefault((group, way, "failed"), []).append(
                            row.predicted.failed / max(row.measured.requests_failed, 1) - 1)
    keys = METRICS + (("failed",) if any(k[2] == "failed" for k in errors) else ())
    print("| runs | replayed from | TTFT | E2E | per-token interval |" + (" failed requests |" if len(keys) > 3 else "")
          + "\n|---|---|---|---|---|" + ("---|" if len(keys) > 3 else ""))
    for group in groups:
        for way in ways:
            cells = [errors.get((group, way, key)) for key in keys]
            print(f"| {group} | {way} | " + " | ".join(
                f"{np.mean(e) * 100:+.1f} % ({min(e) * 100:+.1f}…{max(e) * 100:+.1f})" if e else "" for e in cells)
                + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
