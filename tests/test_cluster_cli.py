"""Cluster runs from the command line: `run -m router=... cluster.replicas=N` writes the cluster
figures and the per-replica timeline, `compare` shows them, P/D (with a step policy per pool) and
bad cluster configs."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from policylab.analysis.compare import main as compare
from policylab.apps.cli import CONFIG_DIR, main
from policylab.apps.run import run


def config(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=["trace=multitenant", "dataplane=sim", "logger=none", "progress=false",
                                            "plots=false", "trace.max_requests=80", *overrides])


@pytest.mark.slow
def test_router_sweep_and_compare_show_the_cluster_figures(tmp_path, capsys):
    main(["run", "-m", "router=round_robin,prefix_affinity", "cluster.replicas=3", "trace=multitenant",
          "trace.max_requests=80", "dataplane=sim", "logger=none", "progress=false", "plots=true",
          f"hydra.sweep.dir={tmp_path}"])
    runs = sorted(p.parent for p in tmp_path.rglob("summary.json"))
    assert len(runs) == 2 and all((d / "cluster_timeline.png").exists() for d in runs)
    requests = pd.read_parquet(runs[0] / "requests.parquet")
    assert set(requests["replica"]) == {0, 1, 2} and (requests["decode_replica"] == -1).all()
    summary = json.loads((runs[0] / "summary.json").read_text())
    figures = summary["cluster"]
    assert figures["num_replicas"] == 3 and figures["load_imbalance"] >= 1.0
    assert sum(r["requests"] for r in figures["replicas"].values()) == 80
    assert figures["goodput_per_gpu"] == pytest.approx(summary["goodput"] / 3)
    assert compare([str(tmp_path)]) == 0
    table = pd.read_csv(tmp_path / "compare" / "compare.csv")
    assert set(table["label"]) == {"prefill_first router=round_robin", "prefill_first router=prefix_affinity"}
    assert table["load imbalance"].notna().all() and table["goodput/GPU (req/s)"].notna().all()


def test_disaggregated_run_records_transfer_and_roles(tmp_path, capsys):
    summary = run(config("cluster.prefill_replicas=1", "cluster.decode_replicas=2", "cluster.link.bandwidth=1e9",
                         "decode_router=power_of_two"), tmp_path)       # a bare router name works here too
    assert summary["status"] == "complete" and summary["counts"]["finished"] == 80
    assert summary["config"]["decode_router"]["name"] == "power_of_two"
    assert "3 replicas, router round_robin" in capsys.readouterr().out.replace("\n", " ")
    roles = [r["role"] for r in summary["cluster"]["replicas"].values()]
    assert roles == ["prefill", "decode", "decode"] and summary["cluster"]["transfer_time"]["p50"] > 1e-3
    requests = pd.read_parquet(tmp_path / "requests.parquet")
    handed = requests[requests["generated_tokens"] > 1]
    assert set(handed["decode_replica"]) <= {1, 2} and (handed["transfer_time"] > 0).all()


def test_each_pd_pool_runs_the_policy_the_command_line_names(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)          # the run directory as configs/config.yaml names it
    main(["run", "trace=multitenant", "trace.max_requests=80", "dataplane=sim", "logger=none", "progress=false",
          "plots=false", "cluster.prefill_replicas=1", "cluster.decode_replicas=2",
          "cluster.prefill_policy={name:chunked,chunk_size:64}", "cluster.decode_policy=decode_first"])
    (run_dir,) = [p.parent for p in (tmp_path / "outputs").rglob("summary.json")]
    assert run_dir.name.endswith("_chunked+decode_first_multitenant")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["policy"] == "chunked+decode_first"
    assert summary["cluster"]["pool_policies"] == {"prefill": "chunked", "decode": "decode_first"}
    assert [r["policy"] for r in summary["cluster"]["replicas"].values()] == ["chunked", "decode_first", "decode_first"]
    pools = summary["config"]["cluster"]
    assert (pools["prefill_policy"]["name"], pools["prefill_policy"]["chunk_size"]) == ("chunked", 64)
    assert pools["decode_policy"] == {"_target_": "policies.decode_first.DecodeFirst", "name": "decode_first",
                                      "admit_into_free_slots": False}
    steps = pd.read_parquet(run_dir / "steps.parquet")
    assert steps[steps["replica"] == 0]["prefill_tokens"].max() == 64      # the prefill pool's chunk size


def test_pool_policy_as_the_policy_group_and_unset_pools_in_the_config(tmp_path):
    summary = run(config("cluster.prefill_replicas=1", "cluster.decode_replicas=1", "policy=chunked",
                         "policy@cluster.decode_policy=slo_aware", "cluster.decode_policy.tpot_slo=0.05",
                         "slo.ttft=0.7"), tmp_path)
    decode = summary["config"]["cluster"]["decode_policy"]
    assert (decode["name"], decode["tpot_slo"], decode["ttft_slo"]) == ("slo_aware", 0.05, 0.7)   # ${slo.ttft}
    assert summary["config"]["cluster"]["prefill_policy"] == summary["config"]["policy"]     # unset: `policy`
    assert summary["policy"] == "chunked+slo_aware"


def test_heterogeneous_hardware_by_name(tmp_path):
    summary = run(config("cluster.replicas=2", "cluster.hardware=[h100,a100]"), tmp_path)
    assert [r["hardware"] for r in summary["cluster"]["replicas"].values()] == ["h100", "a100"]


@pytest.mark.parametrize("overrides, message", [
    (["cluster.replicas=2", "cluster.hardware=[h100]"], "cluster.hardware lists 1 entries for 2 replicas"),
    (["cluster.replicas=2", "cluster.hardware=[h100,tpu9]"], "unknown hardware 'tpu9'"),
    (["cluster.prefill_replicas=2"], "cluster.decode_replicas >= 1"),
    (["cluster.prefill_replicas=1", "cluster.decode_replicas=1", "cluster.decode_policy=decod_first"],
     "cluster.decode_policy=decod_first: no such policy (did you mean decode_first?); available policies "
     "(configs/policy/): chunked, decode_first, dfs_weight, energy_aware, fairness, lpm, plas, prefill_first, priority, "
         "qoe_aware, sjf, slo_aware"),
    (["cluster.prefill_replicas=1", "cluster.decode_replicas=1", "cluster.prefill_policy={name:chunked,chunk_sise:9}"],
     "cluster.prefill_policy: chunk_sise is not a parameter of policy chunked (chunk_size, max_partial_prefills, preempt_mode)"),
    (["cluster.prefill_replicas=1", "cluster.decode_replicas=1", "cluster.prefill_policy={chunk_size:9}"],
     "cluster.prefill_policy: name the policy"),
    (["cluster.prefill_replicas=1", "cluster.decode_replicas=1", "policy@cluster.decode_policy=nope"],
     "Could not find 'policy/nope'"),
    (["cluster.replicas=2", "cluster.decode_policy=decode_first"],
     "cluster.decode_policy is the step policy of the P/D"),
    (["cluster.prefill_replicas=1", "cluster.decode_replicas=1", "cluster.decode_policy={name:chunked,chunk_size:0}"],
     "cluster.decode_policy: cannot build policy"),
])
def test_bad_cluster_configs_fail_in_one_line(overrides, message, capsys):
    with pytest.raises(SystemExit):
        main(["run", "trace=multitenant", "dataplane=sim", "logger=none", "progress=false", "plots=false",
              *overrides, "hydra.run.dir=/tmp/policylab-test-unused"])
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_capacity_search_over_cluster_configurations(tmp_path, monkeypatch, capsys):
    import sys
    monkeypatch.setattr(sys, "argv", ["policylab"])
    rates = {}
    for replicas in (1, 3):
        out = tmp_path / str(replicas)
        main(["capacity", "policy=prefill_first", "trace=poisson", "dataplane=sim", "trace.max_requests=60",
              "slo.ttft=0.2", "target=0.8", "lo=1", "hi=64", "iters=3", f"cluster.replicas={replicas}",
              "router=least_loaded", f"hydra.run.dir={out}",
              "capacity.sustain=false"])    # the ratio of two searches; replays as long as the trace
        rates[replicas] = json.loads((out / "capacity.json").read_text())["rate"]
    assert rates[3] > 1.5 * rates[1]          # three replicas hold well over the load of one


def test_compare_labels_name_a_pool_policy_once():
    from policylab.analysis.run_table import _names_a_pool_policy
    assert _names_a_pool_policy("cluster.decode_policy=decode_first")          # in `prefill_first+decode_first`
    assert _names_a_pool_policy("policy@cluster.prefill_policy=chunked")
    assert not _names_a_pool_policy("cluster.decode_policy={name:decode_first,admit_into_free_slots:true}")
    assert not _names_a_pool_policy("cluster.decode_policy.tpot_slo=0.05")
    assert not _names_a_pool_policy("policy=chunked")
