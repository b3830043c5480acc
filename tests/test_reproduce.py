"""`reproduce`: the statistics behind a verdict, the catalog and command line, and each entry's small
version, whose direction must be the one its gallery section states."""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from policylab.apps.jobs import RunError
from policylab.apps.reproduce import catalog, reproduce
from policylab.apps.reproduce.cli import main
from policylab.apps.reproduce.stats import Measure, direction, magnitude, overall, ratio

SHARED_MOONCAKE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake_synthetic.jsonl"
ENTRIES = ("sarathi", "orca", "vtc", "distserve", "sglang", "mooncake", "autellix", "andes", "llumnix")


@pytest.mark.timeout(60)
def test_a_paired_ratio_pools_on_the_log_scale_with_a_t_interval():
    m = ratio("r", [2.0, 8.0], [1.0, 2.0])          # ratios 2 and 4: geometric mean √8
    assert m.mean == pytest.approx(math.sqrt(8))
    half = 12.706204736174707 * (math.log(4) - math.log(2)) / math.sqrt(2) / math.sqrt(2)
    assert m.low == pytest.approx(math.sqrt(8) / math.exp(half))
    assert m.high == pytest.approx(math.sqrt(8) * math.exp(half))
    plain = Measure("x", "s", [1.0, 2.0, 3.0])
    assert plain.mean == 2.0 and plain.high - plain.mean == pytest.approx(4.302652729911275 / math.sqrt(3))
    assert Measure("x", "s", [5.0]).text() == "5.00 s (n = 1)"
    assert ratio("r", [1.0], [0.0]).n == 0 and Measure("x", "", []).text() == "—"


@pytest.mark.timeout(60)
def test_the_verdict_reads_the_interval_and_the_factor():
    assert direction(ratio("r", [3.0, 3.3, 2.9], [1.0, 1.0, 1.0])) == "holds"
    assert direction(ratio("r", [3.0, 0.9], [1.0, 1.0])) == "holds, within noise"
    assert direction(ratio("r", [0.8, 0.7], [1.0, 1.0])) == "does not hold"
    assert direction(ratio("r", [0.8, 0.7, 0.75], [1.0, 1.0, 1.0]), paper_above_one=False) == "holds"
    assert overall(["holds", "holds, within noise"]) == "holds, within noise"
    assert magnitude(2.0, 2.6).startswith("within 2×")
    assert magnitude(1.0, 6.4) == "6.4× below the paper's"
    assert "not a test" in magnitude(20.0, 2.0, matched=False)


@pytest.mark.timeout(120)
def test_the_catalog_lists_every_entry_ready_with_the_levers_it_needs(capsys):
    assert tuple(catalog()) == ENTRIES
    assert main(["--list"]) == 0
    listed = capsys.readouterr().out
    for name in ENTRIES:
        assert name in listed
    assert "waits for" not in listed                       # migration, the one lever an entry needs, is here
    assert catalog()["llumnix"].requires == ("migration",) and not catalog()["llumnix"].missing_levers()
    for entry in catalog().values():
        assert entry.substitutions and entry.paper_setting and entry.claim.text
        assert entry.measure is not None


@pytest.mark.timeout(120)
def test_an_entry_waiting_for_a_lever_and_an_unknown_one_are_refused(tmp_path, capsys, monkeypatch):
    import policylab.apps.reproduce.levers as levers
    monkeypatch.setitem(levers.LEVERS, "migration", "policylab.cluster.no_such_module")   # (as if it had none)
    with pytest.raises(RunError, match="waits for the migration lever"):
        reproduce("llumnix", out=tmp_path)
    assert not (tmp_path / "result.json").exists()
    assert main(["nosuch", "--out", str(tmp_path)]) == 2
    assert "no entry 'nosuch'" in capsys.readouterr().err


def run(name: str, tmp_path, replicates: int = 2):
    got = reproduce(name, replicates=replicates, out=tmp_path / name, quick=True, log=lambda _: None)
    assert (got.dir / "result.json").is_file() and got.figure.is_file() and (got.dir / "runs.csv").is_file()
    return {c["label"]: c["ours"] for c in got.comparisons}, got


def mean(comparisons: dict, start: str) -> float:
    return next(v["mean"] for k, v in comparisons.items() if k.startswith(start))


@pytest.mark.timeout(300)
def test_sglang_prefix_reuse_and_cache_aware_order_raise_throughput(tmp_path, capsys):
    c, got = run("sglang", tmp_path)
    assert mean(c, "throughput, SGLang") > 1.5 and mean(c, "throughput, LPM / FCFS") > 1.0
    assert got.verdict["direction"].startswith("holds")
    assert "sglang: SGLang" in capsys.readouterr().out          # the paper's claim beside the replay's


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_vtc_stays_within_its_bound_and_fcfs_does_not(tmp_path):
    c, got = run("vtc", tmp_path, replicates=1)
    assert mean(c, "VTC: worst service difference") < 1.0
    assert mean(c, "FCFS: its worst difference") > 1.5          # it grows with the run: unbounded
    assert got.verdict["direction"] == "holds"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_andes_qoe_aware_order_raises_average_qoe(tmp_path):
    c, _ = run("andes", tmp_path)
    assert all(v["mean"] > 1.0 for v in c.values())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_orca_iteration_level_batching_serves_more_at_the_same_latency(tmp_path):
    c, _ = run("orca", tmp_path, replicates=1)
    assert mean(c, "throughput at the same latency") > 2.0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_llumnix_migration_cuts_the_decode_tail(tmp_path):
    c, got = run("llumnix", tmp_path)
    decode = [v["mean"] for k, v in c.items() if k.startswith("P99 decode latency")]
    assert len(decode) == 2 and min(decode) > 1.0 and math.prod(decode) ** 0.5 > 1.2
    assert got.verdict["direction"].startswith("holds")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sarathi_chunked_prefill_raises_capacity_on_both_models(tmp_path):
    c, _ = run("sarathi", tmp_path)
    assert mean(c, "capacity gain, Mistral") > 1.3 and mean(c, "capacity gain, Yi") > 1.3


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_distserve_wins_per_gpu_at_its_tight_slo_and_loses_at_a_relaxed_one(tmp_path):
    c, _ = run("distserve", tmp_path)
    assert mean(c, "per-GPU goodput, P/D / colocated, 13B chatbot, the paper's SLO") > 1.0
    assert mean(c, "per-GPU goodput, P/D / colocated, 13B chatbot, a relaxed SLO") < 1.0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_autellix_plas_serves_more_programs_at_the_same_latency(tmp_path):
    c, _ = run("autellix", tmp_path)
    assert mean(c, "program throughput") > 1.0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mooncake_prefix_aware_disaggregation_serves_more(tmp_path, monkeypatch):
    if not SHARED_MOONCAKE.is_file():
        pytest.skip(f"needs the Mooncake trace sample at {SHARED_MOONCAKE}")
    cache = tmp_path / "cache"
    (cache / "traces" / "mooncake_synthetic").mkdir(parents=True)
    shutil.copyfile(SHARED_MOONCAKE, cache / "traces" / "mooncake_synthetic" / "synthetic_trace.jsonl")
    monkeypatch.setenv("POLICYLAB_CACHE", str(cache))            # the download cache a user's run reads
    c, _ = run("mooncake", tmp_path)
    assert mean(c, "requests served within the SLOs") > 1.0


@pytest.mark.timeout(300)
def test_the_gallery_page_has_each_replayed_entry_and_a_waiting_one(tmp_path, capsys, monkeypatch):
    import policylab.apps.reproduce.levers as levers
    monkeypatch.setitem(levers.LEVERS, "migration", "policylab.cluster.no_such_module")   # (as if it had none)
    page = tmp_path / "docs" / "reproductions.md"
    assert main(["sglang", "llumnix", "--quick", "--replicates", "2", "--out", str(tmp_path / "out"),
                 "--gallery", str(page)]) == 0
    text = page.read_text()
    assert "## SGLang" in text and "![sglang](figures/reproduce/sglang.png)" in text
    assert "`python -m policylab reproduce sglang` · commit `" in text
    assert "Not replayed yet: waiting for the migration lever" in text
    assert (tmp_path / "docs" / "figures" / "reproduce" / "sglang.png").is_file()
    out = capsys.readouterr().out
    assert "llumnix: not replayed: waits for the migration lever" in out and "wall time" in out
    again = tmp_path / "again" / "reproductions.md"              # the page again from the results, no replay
    assert main(["--out", str(tmp_path / "out"), "--gallery", str(again), "--gallery-only"]) == 0
    assert again.read_text() == text
