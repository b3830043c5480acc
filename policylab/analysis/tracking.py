"""Experiment tracking: one W&B run per replay (offline by default), or nothing.

A tracker never decides whether a run succeeds: if W&B cannot start or fails while
logging, the replay goes on, one line on stderr says so, and the local result files
are complete either way. `import wandb` is slow, so it happens only inside `WandbTracker`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from policylab.analysis.metrics import flatten
from policylab.analysis.plots import MEANS, STEP_AGGREGATION, SUMS, downsample_steps
from policylab.analysis.result_reading import first_rows, read_columns
from policylab.core.config import LoggerConfig

RESULT_FILES = ("summary.json", "requests.parquet", "steps.parquet")
RUN_INFO_FILE = "wandb_run.json"    # where compare finds the W&B run of a run directory
STEP_PREFIX = "engine/"             # history keys: engine/clock, engine/batch_size, ...
TABLE_COLUMNS_LEFT_OUT = ("token_times",)   # lists: in requests.parquet, not in the W&B table


@dataclasses.dataclass(frozen=True)
class TrackerSettings:
    """What a W&B run is opened with, made once by the app layer (`apps.settings.tracker_settings`):
    the logger settings, the run's tags, the resolved config it records, and whether W&B samples
    system metrics (only a real plane's run has any worth sampling)."""
    logger: LoggerConfig = dataclasses.field(default_factory=LoggerConfig)
    tags: tuple = ()
    config: dict | None = None
    system_stats: bool = False


class NullTracker:
    """`logger=none`: tracking off."""

    def log_run(self, run_dir, summary: dict) -> None:
        pass

    def log_result(self, summary: dict, tables: dict, images) -> None:
        pass

    def finish(self, exit_code: int | None = None) -> None:
        pass


def open_tracker(settings: TrackerSettings, run_dir, group: str | None = None, name: str | None = None):
    """The tracker `settings.logger` asks for; a NullTracker (and one warning) if W&B cannot start.

    `group` is the W&B group when `logger.group` is unset (the app passes the sweep's name in a
    multirun); `name` the run's name (the app adds a sweep job's overrides; default: the run
    directory's name)."""
    logger = settings.logger
    if logger.kind == "none" or logger.mode == "disabled":
        return NullTracker()
    if logger.kind != "wandb":
        raise ValueError(f"logger.kind must be 'wandb' or 'none', got '{logger.kind}'")
    if logger.mode not in ("offline", "online"):
        raise ValueError(f"logger.mode must be 'offline', 'online' or 'disabled', got '{logger.mode}'")
    try:
        return WandbTracker(settings, Path(run_dir), group, name)
    except Exception as e:
        _warn(f"W&B did not start ({type(e).__name__}: {e})", run_dir)
        return NullTracker()


def engine_summary(steps: pd.DataFrame) -> dict:
    """Whole-run aggregates of the step history for the W&B summary, which would otherwise hold
    each `engine/*` key's last step: totals of counts and time, mean and max of levels."""
    out = {}
    for key, how in STEP_AGGREGATION.items():
        if key not in steps or steps.empty:
            continue
        if how == SUMS:
            out[f"{STEP_PREFIX}{key}"] = float(steps[key].sum())
        elif how == MEANS:
            out[f"{STEP_PREFIX}{key}"] = float(steps[key].mean())
            out[f"{STEP_PREFIX}{key}_max"] = float(steps[key].max())
        else:
            out[f"{STEP_PREFIX}{key}"] = float(steps[key].iloc[-1] + steps["duration"].iloc[-1])  # clock: the end
    return out


def _warn(what: str, run_dir) -> None:
    print(f"warning: {what}; tracking is off for this run, local results are complete in {run_dir}",
          file=sys.stderr)


class WandbTracker:
    def __init__(self, settings: TrackerSettings, run_dir: Path, group: str | None = None, name: str | None = None):
        import wandb
        self.wandb, self.run_dir, self.failed, self.partial = wandb, run_dir, False, False
        logger = settings.logger
        wandb_dir = Path(logger.dir or run_dir)
        wandb_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=logger.project, entity=logger.entity, group=logger.group or group,
            name=name or run_dir.name, tags=list(settings.tags), dir=str(wandb_dir), mode=logger.mode,
            config=settings.config, reinit="finish_previous",
            settings=wandb.Settings(silent=True, console="off", disable_git=True, save_code=False,
                                    x_disable_stats=not settings.system_stats))
        # history sets no summary for engine/*: engine_summary puts whole-run aggregates there
        self.run.define_metric(f"{STEP_PREFIX}*", step_metric=f"{STEP_PREFIX}clock", summary="none")
        self.max_points = logger.max_history_points
        info = {"id": self.run.id, "project": self.run.project, "entity": logger.entity,
                "mode": logger.mode, "dir": str(Path(self.run.dir).parent),
                "url": self.run.url if logger.mode == "online" else None}
        (run_dir / RUN_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        where = info["url"] if logger.mode == "online" else \
            f"{info['dir']} (upload: wandb sync {info['dir']})"
        print(f"W&B {logger.mode} run {self.run.id}: {where}", file=sys.stderr)

    def log_run(self, run_dir, summary: dict) -> None:
        """Step history, summary metrics, the per-request table, plots and the result files."""
        self.partial = summary.get("status") == "partial"      # shown as a failed W&B run
        if self.failed:
            return
        try:
            self._log(Path(run_dir), summary)
        except Exception as e:
            self._fail(e)

    def _log(self, run_dir: Path, summary: dict) -> None:
        wandb, run = self.wandb, self.run
        all_steps = read_columns(run_dir / "steps.parquet")
        steps = downsample_steps(all_steps, self.max_points)
        for row in steps.to_dict("records"):
            run.log({f"{STEP_PREFIX}{k}": v for k, v in row.items() if k != "step"}, step=int(row["step"]))
        metrics = flatten({k: v for k, v in summary.items() if k != "config"})
        run.summary.update({k: v for k, v in metrics.items() if v is not None})
        run.summary.update(engine_summary(all_steps))
        media = {"requests": self._table(pq.ParquetFile(run_dir / "requests.parquet"))}
        media.update({f"plots/{p.stem}": wandb.Image(str(p)) for p in sorted(run_dir.glob("*.png"))})
        run.log(media, step=int(steps["step"].iloc[-1]) + 1 if len(steps) else 0)
        for name in RESULT_FILES:      # files in the W&B run's folder are uploaded with it
            if (run_dir / name).exists():
                shutil.copy2(run_dir / name, Path(run.dir) / name)

    def log_result(self, summary: dict, tables: dict, images) -> None:
        """A job's own result (capacity search, load sweep): summary values, tables, PNGs."""
        if self.failed:
            return
        try:
            self.run.summary.update({k: v for k, v in flatten(summary).items() if v is not None})
            media = {name: self.wandb.Table(dataframe=df.reset_index(drop=True)) for name, df in tables.items()}
            media.update({f"plots/{Path(p).stem}": self.wandb.Image(str(p)) for p in images})
            self.run.log(media)
        except Exception as e:
            self._fail(e)

    def _table(self, file: pq.ParquetFile):
        """The first rows of requests.parquet that a W&B table holds (only those are read)."""
        limit, total = self.wandb.Table.MAX_ROWS, file.metadata.num_rows
        if total > limit:
            print(f"W&B table 'requests' holds the first {limit:,} of {total:,} requests; "
                  "requests.parquet (also saved to the W&B run) has all", file=sys.stderr)
        shown = first_rows(file, limit, [c for c in file.schema_arrow.names if c not in TABLE_COLUMNS_LEFT_OUT])
        # rows as plain lists (missing values None): W&B's dataframe path reads every cell through
        # pandas, slower for the same table
        rows = shown.astype(object).where(shown.notna(), None).to_numpy().tolist()
        return typed_table(self.wandb, list(shown.columns), [column_type(shown[c]) for c in shown], rows)

    def finish(self, exit_code: int | None = None) -> None:
        """Finish the run and stop W&B's service process: only then is the `.wandb` log
        complete on disk (a Hydra joblib worker may be killed without running atexit).
        `exit_code`: the job's own (128 + a stop signal's number), else 1 for a partial run."""
        if exit_code is None:
            exit_code = 1 if self.failed or self.partial else 0
        try:
            self.run.finish(exit_code=exit_code)
            self.wandb.teardown()
        except Exception as e:
            self._fail(e)

    def _fail(self, e: Exception) -> None:
        if not self.failed:
            self.failed = True
            _warn(f"W&B logging failed ({type(e).__name__}: {e})", self.run_dir)


def column_type(column: pd.Series) -> type:
    """The W&B type of a results column, from its dtype: number, bool or string (missing values
    allowed in each)."""
    kind = column.dtype.kind
    return bool if kind == "b" else float if kind in "fiu" else str


def typed_table(wandb, columns: list, types: list, rows: list):
    """A W&B table whose column types are declared, not inferred cell by cell: the columns come
    from one typed frame, so W&B checks the first row against the declared types and the rest
    share them (W&B's inference reads every cell and is most of the logging time of a large run)."""
    table = wandb.Table(columns=columns, dtype=types, optional=True)
    if rows:
        table.add_data(*rows[0])
        table.data.extend(rows[1:])
    return table


class ReportError(Exception):
    """Why `compare --wandb-online` could not create the report: one sentence, no traceback."""


def _logged_in_api(wandb):
    """The W&B public API, or ReportError when W&B is offline or nobody is logged in."""
    mode = os.environ.get("WANDB_MODE", "")
    if mode in ("offline", "disabled", "dryrun"):
        raise ReportError(f"W&B is {mode} here (WANDB_MODE={mode}); unset WANDB_MODE to reach the W&B server")
    try:
        api = wandb.Api()
    except Exception as e:       # wandb raises UsageError (no key) or a network error, first
        raise ReportError(f"not logged in to W&B or the server is unreachable ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else 'no detail'}); run `wandb login` "
                          "or set WANDB_API_KEY") from None
    if not api.api_key:
        raise ReportError("not logged in to W&B: run `wandb login` or set WANDB_API_KEY")
    return api


def log_comparison(out: Path, tables: dict, images: list, group: str | None, online: bool = False,
                   info: dict | None = None) -> str:
    """`compare --log-wandb`: the comparison as a W&B run of its own (job type `compare`, in the
    sweep's group): the grouped table with CIs and the per-class tables as W&B tables, the
    figures as images, and every file of `out`. What it says, never raises: W&B never fails compare.
    `info`, when given, receives the run's id, project and entity (for a report's panels)."""
    try:
        import wandb
        run = wandb.init(project="policylab", job_type="compare", group=group, name=f"compare {group or out.name}",
                         dir=str(out), mode="online" if online else "offline", reinit="finish_previous",
                         settings=wandb.Settings(silent=True, console="off", disable_git=True, save_code=False,
                                                 x_disable_stats=True))
        media = {name: wandb.Table(dataframe=df.reset_index(drop=True)) for name, df in tables.items()}
        media.update({f"figures/{Path(p).stem}": wandb.Image(str(p)) for p in images})
        run.log(media)
        for path in sorted(out.glob("*.*")):
            if path.is_file():
                shutil.copy2(path, Path(run.dir) / path.name)
        where = run.url if online else f"{Path(run.dir).parent} (upload: wandb sync {Path(run.dir).parent})"
        if info is not None:
            info.update({"id": run.id, "project": run.project, "entity": run.entity})
        run.finish()
        wandb.teardown()
        return f"W&B comparison run: {where}"
    except Exception as e:
        return f"W&B comparison run: not logged ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"


def create_report(run_dirs: list[Path], metric_paths: list[tuple], markdown: Path, comparison: dict | None = None,
                  figures: tuple = (), tables: tuple = ()) -> str:
    """A W&B report of these runs (table, bar charts of the metrics, run comparer): its URL, or
    why there is nothing to report. Runs logged offline must be uploaded (`wandb sync`) first.
    With `comparison` (the comparison's own W&B run: id, project, entity) a second panel grid
    shows that run's `figures` (metric against load with CI bands, CDFs) and `tables`.
    Raises ReportError when the report cannot be made (no reports API, offline, not logged in)."""
    infos = [json.loads((d / RUN_INFO_FILE).read_text()) for d in run_dirs if (d / RUN_INFO_FILE).exists()]
    if not infos:
        return f"W&B report: skipped (no run has a {RUN_INFO_FILE}: they were run with logger=none)"
    try:
        import wandb
        import wandb_workspaces.reports.v2 as wr
    except ImportError:
        raise ReportError("the W&B reports API is not installed: pip install wandb-workspaces") from None
    api = _logged_in_api(wandb)
    offline = [i["dir"] for i in infos if i["mode"] == "offline"]     # (not uploaded: "synced" ones were)
    entity, project = infos[0]["entity"] or api.default_entity, infos[0]["project"]
    ids = ", ".join(repr(i["id"]) for i in infos)
    runset = wr.Runset(entity=entity, project=project, name="compared runs",
                       filters=f"Metric('ID') in [{ids}]")
    panels = [wr.BarPlot(title="/".join(p), metrics=[wr.SummaryMetric("/".join(p))]) for p in metric_paths]
    grid = wr.PanelGrid(runsets=[runset], panels=[*panels, wr.RunComparer(diff_only="split")])
    blocks = [wr.MarkdownBlock(text=_without_images(markdown.read_text())), grid]
    if comparison:
        own = wr.Runset(entity=comparison.get("entity") or entity, project=comparison.get("project") or project,
                        name="comparison", filters=f"Metric('ID') in [{comparison['id']!r}]")
        shown = [wr.MediaBrowser(title="figures: metric against load (95% CI bands), latency CDFs",
                                 media_keys=[f"figures/{f}" for f in figures], num_columns=1)] if figures else []
        shown += [wr.WeavePanelSummaryTable(table_name=t) for t in tables]
        blocks += [wr.H2(text="Load curves, latency CDFs and per-class tables"),
                   wr.PanelGrid(runsets=[own], panels=shown)]
    report = wr.Report(entity=entity, project=project, title=f"policylab: comparison of {len(infos)} runs",
                       blocks=blocks)
    try:
        report.save()
    except Exception as e:
        raise ReportError(f"W&B did not save the report ({type(e).__name__}: {str(e)[:200]})") from None
    hint = f" ({len(offline)} runs were logged offline: `wandb sync` them to fill it)" if offline else ""
    return f"W&B report: {report.url}{hint}"


def _without_images(markdown: str) -> str:
    """Local image links mean nothing in a W&B report."""
    return "\n".join(line for line in markdown.splitlines() if not line.startswith("!["))
