"""The documentation's notebook runs clean on a real Jupyter kernel (nbclient + ipykernel, the
`docs` extra): every cell, in order, in a scratch directory, with no error output."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient", reason="the docs extra is not installed (pip install -e '.[docs]')")
nbformat = pytest.importorskip("nbformat", reason="the docs extra is not installed (pip install -e '.[docs]')")
pytest.importorskip("ipykernel", reason="the docs extra is not installed (pip install -e '.[docs]')")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(600)
def test_the_notebook_runs_clean_on_a_jupyter_kernel(tmp_path, monkeypatch):
    shutil.copy(ROOT / "docs" / "notebook.ipynb", tmp_path / "notebook.ipynb")
    nb = nbformat.read(tmp_path / "notebook.ipynb", as_version=4)
    # the kernel imports this checkout's policylab, wherever it runs
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors
    assert (tmp_path / "notebook_runs" / "ttft_cdf.png").stat().st_size > 0
    assert (tmp_path / "notebook_runs" / "compare" / "compare.md").is_file()
    shown = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "")     # the printed table, then
                    for o in nb.cells[5].outputs)                                   # the DataFrame
    assert "prefill_first" in shown and "slo_aware" in shown
