"""Generators: arrival statistics, fitted length distributions, multitenant mix, prefixes, the repo traces."""
import json
from pathlib import Path

import numpy as np
import pytest

from policylab.traces import TraceConfig, load_trace
from policylab.traces.arrivals import ArrivalProcess
from policylab.apps.trace_cli import main
from policylab.traces.generate import ClientSpec, PrefixPool, generate_trace, multitenant_clients
from policylab.traces.lengths import LengthDist

ROOT = Path(__file__).resolve().parents[1]


def _gaps(times):
    return np.diff(times)


@pytest.mark.parametrize("rate", [0.5, 4.0, 50.0])
def test_poisson_mean_rate_and_cv(rate):
    t = ArrivalProcess("poisson", rate=rate).sample(np.random.default_rng(1), 20_000)
    assert np.all(np.diff(t) >= 0)
    assert (len(t) - 1) / (t[-1] - t[0]) == pytest.approx(rate, rel=0.03)
    assert _gaps(t).std() / _gaps(t).mean() == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_cv_is_the_burstiness(cv):
    t = ArrivalProcess("gamma", rate=3.0, cv=cv).sample(np.random.default_rng(2), 40_000)
    assert (len(t) - 1) / t[-1] == pytest.approx(3.0, rel=0.08)
    assert _gaps(t).std() / _gaps(t).mean() == pytest.approx(cv, rel=0.1)


def test_mmpp_long_run_rate_and_burstiness():
    p = ArrivalProcess("bursty", on_rate=20, off_rate=1, on_duration=2, off_duration=8)
    t = p.sample(np.random.default_rng(3), 50_000)
    assert p.mean_rate == pytest.approx(4.8)
    assert len(t) / t[-1] == pytest.approx(p.mean_rate, rel=0.1)
    assert _gaps(t).std() / _gaps(t).mean() > 1.5      # far burstier than Poisson


def test_lognormal_is_fitted_to_mean_and_percentile():
    d = LengthDist.parse("lognormal:mean=256,p90=512")
    x = d.sample(np.random.default_rng(4), 200_000)
    assert x.mean() == pytest.approx(256, rel=0.02)
    assert np.percentile(x, 90) == pytest.approx(512, rel=0.02)
    capped = LengthDist.parse("lognormal:mean=300,p99=1800,max=2000").sample(np.random.default_rng(5), 50_000)
    assert capped.max() == 2000 and capped.min() >= 1
    assert np.percentile(capped, 99) == pytest.approx(1800, rel=0.05)


def test_fixed_and_uniform_lengths():
    rng = np.random.default_rng(6)
    assert set(LengthDist.parse("fixed:128").sample(rng, 100)) == {128}
    u = LengthDist.parse("uniform:32,64").sample(rng, 10_000)
    assert u.min() == 32 and u.max() == 64 and u.mean() == pytest.approx(48, rel=0.02)


@pytest.mark.parametrize("spec,msg", [("lognormal:mean=100,p90=1000", "at most"), ("gauss:1", "bad length spec"),
                                      ("uniform:10", "bad length spec"), ("lognormal:p90=5", "need mean"),
                                      ("fixed:0", ">= 1"), ("lognormal:mean=5,p90", "key=value")])
def test_bad_length_specs_are_explained(spec, msg):
    with pytest.raises(ValueError, match=msg):
        LengthDist.parse(spec)


def test_same_seed_same_trace_other_seed_other_trace():
    clients = multitenant_clients(3, 1.0, flood_factor=4)
    assert generate_trace(clients, 200, seed=7) == generate_trace(clients, 200, seed=7)
    assert generate_trace(clients, 200, seed=7) != generate_trace(clients, 200, seed=8)


def test_multitenant_flooder_share_and_slo_classes():
    clients = multitenant_clients(4, 1.0, flood_factor=4, slo_classes=[("batch", 5, 0.5), ("fast", 0.5, 0.05)])
    reqs = generate_trace(clients, 4000, seed=0)
    counts = {c.name: sum(r.client == c.name for r in reqs) for c in clients}
    assert counts["flooder"] / len(reqs) == pytest.approx(4 / 7, abs=0.03)
    assert counts["flooder"] >= 3.5 * max(v for k, v in counts.items() if k != "flooder")
    slos = {r.client: (r.ttft_slo, r.tpot_slo) for r in reqs}
    assert slos == {"flooder": (5, 0.5), "client-1": (0.5, 0.05), "client-2": (5, 0.5), "client-3": (0.5, 0.05)}
    times = [r.arrival_time for r in reqs]
    assert times[0] == 0.0 and times == sorted(times)


def test_prefix_pool_shares_blocks_only_inside_full_blocks():
    pool = PrefixPool(size=3, blocks=2, share=0.5, block_tokens=64)
    spec = ClientSpec("a", prompt_len=LengthDist("uniform", low=32, high=400), prefix=pool)
    reqs = generate_trace([spec, ClientSpec("b", prefix=pool)], 2000, seed=1)
    with_prefix = [r for r in reqs if r.prefix_hashes]
    assert 0.35 < len(with_prefix) / len(reqs) < 0.5           # share 0.5, minus prompts < 64 tokens
    assert all(len(r.prefix_hashes) <= r.prompt_tokens // 64 for r in reqs)
    ids_a = {h for r in reqs if r.client == "a" for h in r.prefix_hashes}
    ids_b = {h for r in reqs if r.client == "b" for h in r.prefix_hashes}
    assert len(ids_a) == len(ids_b) == 6 and not ids_a & ids_b   # per-client pools never collide


REPO_TRACES = {"poisson": 300, "bursty": 200, "multitenant": 300, "chat_sessions": 240}


@pytest.mark.parametrize("name,count", REPO_TRACES.items())
def test_repo_traces_are_small_and_load_through_their_configs(name, count):
    from omegaconf import OmegaConf
    path = ROOT / "traces" / f"{name}.jsonl"
    assert path.stat().st_size < 200_000
    cfg = OmegaConf.merge(OmegaConf.structured(TraceConfig), OmegaConf.load(ROOT / "configs/trace" / f"{name}.yaml"))
    trace = load_trace(cfg)
    assert len(trace) == count and trace[0].arrival_time == 0.0


def test_readme_commands_regenerate_the_repo_traces_byte_for_byte(tmp_path):
    readme = (ROOT / "traces" / "README.md").read_text()
    block = readme.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    commands = [line.split() for line in block.splitlines() if line.strip()]
    assert len(commands) == len(REPO_TRACES)
    for words in commands:
        assert words[:3] == ["python", "-m", "policylab.apps.trace_cli"]
        out = words[words.index("-o") + 1]
        words[words.index("-o") + 1] = str(tmp_path / Path(out).name)
        assert main(words[3:]) == 0
        assert (tmp_path / Path(out).name).read_bytes() == (ROOT / out).read_bytes(), out


def test_multitenant_repo_trace_has_a_flooder_and_slo_classes():
    reqs = [json.loads(line) for line in (ROOT / "traces" / "multitenant.jsonl").open()]
    counts = {}
    for r in reqs:
        counts[r["client"]] = counts.get(r["client"], 0) + 1
    assert len(counts) == 4
    assert counts["flooder"] >= 4 * 0.7 * max(v for k, v in counts.items() if k != "flooder")
    assert {(r["ttft_slo"], r["tpot_slo"]) for r in reqs} == {(5.0, 0.5), (0.5, 0.05)}
