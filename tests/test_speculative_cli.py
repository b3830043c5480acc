"""Speculative decoding from the command line: `policy=spec_adaptive`, `speculative.k=K` around any
policy, `speculative.method=draft`; the summary's `speculative` section, its printout and compare
columns; a bad key and `dataplane=vllm` are one clear error each."""
from __future__ import annotations

import json

import pytest

from policylab.apps.cli import main

pytestmark = pytest.mark.timeout(300)
BASE = ["trace=poisson", "trace.max_requests=60", "dataplane=sim", "logger=none", "plots=false", "progress=false"]


def summary_of(tmp_path, *overrides) -> dict:
    main(["run", *BASE, *overrides, f"hydra.run.dir={tmp_path}"])
    return json.loads((tmp_path / "summary.json").read_text())


def test_fixed_k_and_adaptive_runs_report_their_drafts(tmp_path, capsys):
    plain = summary_of(tmp_path / "plain", "policy=chunked")
    fixed = summary_of(tmp_path / "fixed", "policy=chunked", "speculative.k=2")
    adaptive = summary_of(tmp_path / "adaptive", "policy=spec_adaptive")
    out = capsys.readouterr().out
    assert "speculative" not in plain and fixed["policy"] == "chunked+spec2"
    for s in (fixed, adaptive):
        spec = s["speculative"]
        assert spec["accepted_tokens"] + spec["rejected_tokens"] == spec["proposed_tokens"] > 0
        assert 1 < spec["tokens_per_step"] <= 5 and 0 < spec["acceptance_rate"] < 1
        assert s["counts"]["finished"] == 60
    assert fixed["tpot"]["mean"] < plain["tpot"]["mean"]          # low load: drafts pay
    assert "speculation" in out and "% accepted" in out
    with pytest.raises(SystemExit) as stop:
        main(["compare", str(tmp_path / "plain"), str(tmp_path / "fixed")])
    assert stop.value.code == 0
    import pandas as pd
    table = pd.read_csv(tmp_path / "plain" / "compare" / "compare.csv").set_index("label")
    assert table.loc["chunked+spec2 speculative.k=2", "acceptance (%)"] == pytest.approx(
        100 * fixed["speculative"]["acceptance_rate"])
    assert table["tokens/step (tokens)"].isna().tolist() == [True, False]


@pytest.mark.slow
def test_a_draft_model_makes_the_steps_slower_than_free_ngram_drafts(tmp_path):
    ngram = summary_of(tmp_path / "ngram", "policy=chunked", "speculative.k=2")
    draft = summary_of(tmp_path / "draft", "policy=chunked", "speculative.k=2", "speculative.method=draft",
                       "speculative.draft_model=qwen2-0.5b")
    assert draft["speculative"]["proposed_tokens"] == ngram["speculative"]["proposed_tokens"]
    assert draft["tpot"]["mean"] > ngram["tpot"]["mean"]


@pytest.mark.parametrize("override, message", [
    ("speculative.method=eagle", "speculative.method must be one of ngram, draft"),
    ("speculative.method=draft", "needs speculative.draft_model"),
    ("speculative.acceptance_rate=1.5", "speculative.acceptance_rate must be in [0, 1]"),
])
def test_bad_speculative_settings_are_one_clear_error(tmp_path, capsys, override, message):
    with pytest.raises(SystemExit) as stop:
        main(["run", *BASE, "policy=chunked", override, f"hydra.run.dir={tmp_path}"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.slow
def test_the_vllm_plane_refuses_draft_tokens(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["run", "trace=poisson", "dataplane=vllm", "logger=none", "plots=false", "progress=false",
              "policy=chunked", "speculative.k=2", f"hydra.run.dir={tmp_path}"])
    err = capsys.readouterr().err
    assert "speculation and dataplane=vllm do not compose" in err and "Traceback" not in err


def test_replicas_and_pd_speculate_as_one_engine_does(tmp_path):
    """speculative.k gives every replica's decodes their drafts; the summary sums their counters."""
    for name, shape in (("replicas", ["cluster.replicas=2"]),
                        ("pd", ["cluster.prefill_replicas=1", "cluster.decode_replicas=1"])):
        s = summary_of(tmp_path / name, "policy=chunked", "speculative.k=2", *shape)
        assert s["status"] == "complete" and s["speculative"]["verifications"] > 0
        spec = s["speculative"]
        assert 0 < spec["accepted_tokens"] <= spec["proposed_tokens"] <= 2 * spec["verifications"]


def test_a_native_trace_carries_each_request_s_acceptance_rate(tmp_path, capsys):
    good = tmp_path / "good.jsonl"
    good.write_text("".join(f'{{"arrival_time": {0.1 * i}, "prompt_tokens": 30, "output_tokens": 40, '
                            f'"spec_acceptance": {a}}}\n' for i, a in enumerate((0.0, 1.0) * 3)))
    s = summary_of(tmp_path / "run", "policy=chunked", "speculative.k=2", "trace=file", f"trace.path={good}")
    spec = s["speculative"]
    # per pair: the alpha-1 request emits 3 tokens in each of 13 verifications after its first token
    # (26 drafts, all accepted), the alpha-0 one 1 token in each of 39 (78 drafts, none accepted)
    assert (spec["proposed_tokens"], spec["accepted_tokens"]) == (3 * (26 + 78), 3 * 26)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"arrival_time": 0, "prompt_tokens": 3, "output_tokens": 4, "spec_acceptance": 1.5}\n')
    with pytest.raises(SystemExit):
        main(["run", *BASE, "policy=chunked", "trace=file", f"trace.path={bad}", f"hydra.run.dir={tmp_path / 'b'}"])
    err = capsys.readouterr().err
    assert "spec_acceptance" in err and "[0, 1]" in err and "Traceback" not in err
