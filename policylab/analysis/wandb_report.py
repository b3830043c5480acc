"""`compare --wandb-online`: everything the W&B report needs, done by compare itself.

1. the login is checked first (a report needs the W&B server; one sentence when it cannot be reached);
2. the compared runs that were logged offline are uploaded (`wandb sync <run folder>`), and
   their `wandb_run.json` says so, so a second compare does not upload them again;
3. the comparison is logged as a W&B run of its own: the grouped table with its 95% intervals,
   the per-SLO-class and per-client tables, and the figures (metric against load with CI bands,
   latency CDFs, capacity curves);
4. the report holds the markdown comparison, bar charts and a run comparer of the runs, and a
   second panel grid on the comparison run: its figures and its tables.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from policylab.analysis.tracking import RUN_INFO_FILE, ReportError, _logged_in_api, create_report, log_comparison

SYNC_TIMEOUT_S = 600


def wandb_sync(folder: str) -> None:
    """Upload one offline W&B run folder (the `wandb sync` command of the installed wandb)."""
    done = subprocess.run([sys.executable, "-m", "wandb", "sync", folder], capture_output=True, text=True,
                          timeout=SYNC_TIMEOUT_S)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ReportError(f"`wandb sync {folder}` failed (exit {done.returncode}: {last[0]})")


def sync_offline_runs(run_dirs, sync=None) -> list[str]:
    """Upload every compared run logged offline (with `sync`, default `wandb_sync`); their ids."""
    sync = sync or wandb_sync
    uploaded = []
    for run_dir in map(Path, run_dirs):
        path = run_dir / RUN_INFO_FILE
        if not path.is_file():
            continue
        info = json.loads(path.read_text())
        if info.get("mode") != "offline":
            continue
        print(f"W&B: uploading offline run {info['id']} ({info['dir']})", file=sys.stderr)
        sync(info["dir"])
        info["mode"] = "synced"
        path.write_text(json.dumps(info, indent=2) + "\n")
        uploaded.append(info["id"])
    return uploaded


def publish(run_dirs, metric_paths, out: Path, tables: dict, figures: list, group: str | None,
            sync=None) -> str:
    """Steps 1-4 of the module doc; the report's URL line. Raises ReportError (one sentence)."""
    try:
        import wandb
    except ImportError:
        raise ReportError("wandb is not installed") from None
    _logged_in_api(wandb)
    uploaded = sync_offline_runs(run_dirs, sync)
    comparison: dict = {}
    message = log_comparison(out, tables, figures, group, online=True, info=comparison)
    if not comparison:
        raise ReportError(f"the comparison run was not logged ({message})")
    report = create_report(run_dirs, metric_paths, out / "compare.md", comparison=comparison,
                           figures=[Path(f).stem for f in figures], tables=list(tables))
    return report + (f" ({len(uploaded)} offline runs uploaded first)" if uploaded else "")
