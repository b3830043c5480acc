"""Every metric is declared once (`metric_catalog`): every number a run's summary holds has a
declaration, compare's columns and the printout use them, docs/metrics.md documents each."""
from __future__ import annotations

from pathlib import Path

import pytest

from policylab.analysis.metric_catalog import METRICS, NOT_METRICS, REPLICA_METRICS, lookup
from policylab.analysis.run_table import COLUMNS
from tests.test_plots_compare import make_run_dir

pytestmark = pytest.mark.timeout(120)
DOCS = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def numbers(summary: dict, prefix: str = ""):
    for key, value in summary.items():
        path = f"{prefix}{key}"
        if any(path == k or path.startswith(k + ".") for k in NOT_METRICS):
            continue
        if isinstance(value, dict):
            yield from numbers(value, path + ".")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) or value is None:
            yield path


def test_every_summary_number_is_declared(tmp_path):
    import json
    run = make_run_dir(tmp_path / "run", n=40, rate=60.0)
    summary = json.loads((run / "summary.json").read_text())
    keys = list(numbers(summary))
    assert len(keys) > 60
    for key in keys:
        lookup(key)                       # KeyError names an undeclared summary key


def test_compare_columns_are_declared_metrics_in_their_shown_unit():
    for c in COLUMNS:
        m = METRICS[c.metric]
        assert c.field == "" or m.distribution
        assert c.scale == {"ms": 1e3, "%": 100.0}.get(c.unit, 1.0)
        assert c.label.startswith(m.name)
    assert {c.label for c in COLUMNS} >= {"TTFT p99 (ms)", "SLO attainment (%)", "Jain (windowed)"}


def test_docs_describe_every_declared_metric():
    text = DOCS.read_text()
    missing = [k for k in [*METRICS, *REPLICA_METRICS] if f"`{k}`" not in text]
    assert not missing, f"docs/metrics.md lacks {missing}"
