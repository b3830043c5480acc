"""The documentation: the README is a front page, the docs site builds with `mkdocs build --strict`
(a broken link or anchor fails it), and user docs carry no issue numbers, dates or narrative."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NARRATIVE = re.compile(r"(?<![\w&/])#\d{1,4}\b|\b20\d\d-\d\d-\d\d\b|this session|session before|[Ii]ssue \d+")
USER_DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "design.md")]


def test_the_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    assert "../shared" not in text                    # a user's clone has no ../shared
    for page in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / page).is_file(), f"README links to {page}, which does not exist"


@pytest.mark.parametrize("page", USER_DOCS, ids=lambda p: p.name)
def test_user_docs_carry_no_issue_numbers_dates_or_narrative(page):
    hits = [f"{page.name}:{n}: {line.strip()}" for n, line in enumerate(page.read_text().splitlines(), 1)
            if NARRATIVE.search(line)]
    assert not hits, "\n".join(hits)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    pytest.importorskip("mkdocstrings", reason="the docs extra is not installed (pip install -e '.[docs]')")
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "",
                                                                       "HOME": str(tmp_path)}, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    for page in ("index", "python-api", "results", "reference"):
        assert (tmp_path / "site" / page / "index.html").is_file() or (tmp_path / "site" / f"{page}.html").is_file()
    reference = (tmp_path / "site" / "reference" / "index.html").read_text()
    assert "Replay <code>trace</code> under" in reference          # the API reference is the docstrings
    assert "admission_order" in reference and "SchedulerView" in reference


def test_mkdocs_nav_names_only_pages_that_exist():
    import yaml
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    pages = [p for entry in nav for p in entry.values()]
    assert pages and all((ROOT / "docs" / p).is_file() for p in pages), pages
