"""`trace` CLI in-process: inspect (shared samples + plot), convert, generate, clean errors."""
import re
from pathlib import Path

import pytest

from policylab.traces import TraceConfig, load_trace
from policylab.apps.trace_cli import main

SHARED = Path(__file__).parents[1].parent / "shared" / "traces"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"public trace samples not found at {SHARED}")


def _number(text, label):
    return float(re.search(rf"^{label}\s+([-\d.]+)", text, re.M).group(1))


@needs_shared
def test_inspect_azure_sample_with_plot(tmp_path, capsys):
    assert main(["inspect", str(SHARED / "azure_code_2023.csv"), "--plot", str(tmp_path / "a.png")]) == 0
    out = capsys.readouterr().out
    assert _number(out, "requests") == 8819
    assert 3400 < _number(out, "duration") < 3500
    assert _number(out, "mean rate") == pytest.approx(8819 / _number(out, "duration"), rel=1e-3)
    assert _number(out, "inter-arrival CV") > 1          # the code trace is bursty
    assert re.search(r"prompt tokens\s+mean\s+[\d.]+\s+p50\s+[\d.]+\s+p90\s+[\d.]+\s+p99\s+[\d.]+\s+max", out)
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_shared
def test_inspect_mooncake_sample_reports_prefix_sharing(capsys):
    assert main(["inspect", str(SHARED / "mooncake_synthetic.jsonl")]) == 0
    out = capsys.readouterr().out
    assert _number(out, "requests") == 3993
    assert 0.3 < _number(out, "prefix sharing") < 0.95


def test_inspect_counts_clients_and_slo_classes(capsys):
    assert main(["inspect", "traces/multitenant.jsonl", "--prefix-block-tokens", "64"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^clients\s+4$", out, re.M) and re.search(r"^\s+flooder\s+\d+", out, re.M)
    assert "(0.5, 0.05)" in out and _number(out, "prefix sharing") > 0


def test_convert_applies_transforms_and_round_trips(tmp_path, capsys):
    out_jsonl, out_pq = tmp_path / "p.jsonl", tmp_path / "p.parquet"
    assert main(["convert", "traces/poisson.jsonl", str(out_jsonl), "--max-requests", "50", "--rate-scale", "2"]) == 0
    assert main(["convert", str(out_jsonl), str(out_pq)]) == 0
    a, b = load_trace(TraceConfig(path=str(out_jsonl))), load_trace(TraceConfig(path=str(out_pq)))
    assert len(a) == 50 and list(a) == list(b)
    original = load_trace(TraceConfig(path="traces/poisson.jsonl", max_requests=50))
    assert a[-1].arrival_time == pytest.approx(original[-1].arrival_time / 2)


@pytest.mark.parametrize("kind,extra", [("poisson", []), ("gamma", ["--cv", "3"]), ("bursty", []),
                                        ("multitenant", ["--slo-class", "gold=1/0.1"])])
def test_generate_every_kind(tmp_path, kind, extra, capsys):
    out = tmp_path / f"{kind}.jsonl"
    assert main(["generate", "--kind", kind, "-n", "120", "-o", str(out)] + extra) == 0
    trace = load_trace(TraceConfig(path=str(out)))
    assert len(trace) == 120 and trace[0].arrival_time == 0.0


def test_bad_input_is_one_line_on_stderr_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"arrival_time": 0, "prompt_tokens": "abc", "output_tokens": 1}\n')
    assert main(["inspect", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "x.jsonl:1: field 'prompt_tokens'" in err
    assert main(["generate", "--kind", "poisson", "--prompt-len", "gauss:3", "-o", str(tmp_path / "g.jsonl")]) == 2
    assert "bad length spec" in capsys.readouterr().err
    assert main(["convert", "traces/poisson.jsonl", str(tmp_path / "out.txt")]) == 2
    assert "must end in .jsonl" in capsys.readouterr().err


def test_help_explains_every_subcommand(capsys):
    for cmd in (["--help"], ["inspect", "--help"], ["generate", "--help"], ["convert", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(cmd)
        assert e.value.code == 0
    out = capsys.readouterr().out
    assert "lognormal:mean=M,p90=V" in out and "--rate-scale" in out and "--plot" in out
