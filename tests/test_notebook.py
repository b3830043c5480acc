"""The documentation's notebook runs clean on a real Jupyter kernel (nbclient + ipykernel, the
`docs` extra): every cell, in order, with no error output, and its runs go to a temporary
directory, never beside the notebook (in a checkout: into the repository's docs/)."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient", reason="the docs extra is not installed (pip install -e '.[docs]')")
nbformat = pytest.importorskip("nbformat", reason="the docs extra is not installed (pip install -e '.[docs]')")
pytest.importorskip("ipykernel", reason="the docs extra is not installed (pip install -e '.[docs]')")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
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
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notebook.ipynb"]       # nothing beside the notebook
    shown = nb.cells[1].outputs[-1]["data"]["text/plain"]                        # out = Path(tempfile.mkdtemp())
    out = Path(shown.split("'")[1])
    try:
        assert out.name.startswith("policylab-notebook-") and out.parent == Path(tempfile.gettempdir())
        assert (out / "ttft_cdf.png").stat().st_size > 0 and (out / "compare" / "compare.md").is_file()
    finally:
        shutil.rmtree(out, ignore_errors=True)
    shown = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "")     # the printed table, then
                    for o in nb.cells[5].outputs)                                   # the DataFrame
    assert "prefill_first" in shown and "slo_aware" in shown
