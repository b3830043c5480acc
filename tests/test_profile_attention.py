"""Vidur's attention.csv as the sim's attention term (`dataplane.profile=DIR`), on real rows of the
published A100 Llama-3-8B profile (tests/data/vidur, see its README) and on synthetic grids."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from policylab.core.config import HardwareConfig, ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane.profile import ProfileCostModel
from policylab.dataplane.profile_attention import ProfiledAttention
from policylab.dataplane.profile_csv import ProfileError
from policylab.dataplane.sim import SimDataPlane

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "vidur" / "compute" / "a100" / "meta-llama" / "Meta-Llama-3-8B"
LLAMA3_8B = ModelConfig(**yaml.safe_load((ROOT / "configs" / "model" / "llama3-8b.yaml").read_text()))


def fixture_rows(tp: int = 1) -> list:
    """(query lengths, context lengths, measured per-layer seconds: kernel + KV write) of each row."""
    out = []
    with open(FIXTURE / "attention.csv", newline="") as f:
        for r in csv.DictReader(f):
            if int(r["num_tensor_parallel_workers"]) != tp:
                continue
            chunk, cached, batch = int(r["prefill_chunk_size"]), int(r["kv_cache_size"]), int(r["batch_size"])
            phase = "prefill" if chunk else "decode"
            ms = float(r[f"time_stats.attn_{phase}.median"]) + float(r["time_stats.attn_kv_cache_save.median"])
            out.append(([chunk], [cached], ms / 1e3) if chunk else ([1] * batch, [cached] * batch, ms / 1e3))
    return out


def test_the_published_format_reads_and_every_profiled_row_is_reproduced():
    model = ProfileCostModel(LLAMA3_8B, HardwareConfig(), DataplaneConfig(kind="sim", profile=str(FIXTURE)))
    assert model.attention is not None and [p.name for p in model.files] == ["mlp.csv", "attention.csv"]
    rows = fixture_rows()
    assert sum(len(q) > 1 for q, _, _ in rows) > 15 and sum(len(q) == 1 for q, _, _ in rows) > 15
    for q, ctx, seconds in rows:      # rows profiled twice (chunk 1,024, batch 128) are averaged: within 0.5 %
        assert model.attention(q, ctx) == pytest.approx(seconds, rel=0.01), (len(q), q[0], ctx[0])
    tp4 = ProfiledAttention(FIXTURE / "attention.csv", LLAMA3_8B, 4)
    for q, ctx, seconds in fixture_rows(tp=4):
        assert tp4(q, ctx) == pytest.approx(seconds, rel=1e-9)


def test_the_sim_step_carries_the_profiled_attention_of_every_layer():
    """A step's attention term is 32 layers x the fixture row, for a decode batch and a prefill chunk."""
    sim = SimDataPlane(LLAMA3_8B, HardwareConfig(), DataplaneConfig(kind="sim", profile=str(FIXTURE)))
    cost = sim.cost_model
    decode = ([1] * 64, [480] * 64, (0.096 + 0.003) / 1e3)           # batch 64, 480 cached
    prefill = ([1024], [2048], (0.414 + 0.545) / 1e3)                 # chunk 1,024 after 2,048 cached
    for q, ctx, per_layer in (decode, prefill):
        tokens = sum(q)
        attention = cost.step_time(q, ctx, tokens, len(q)) - cost.dense_time(tokens) \
            - cost.roofline.lm_head_time(len(q)) - cost.overhead
        assert attention == pytest.approx(32 * per_layer, rel=0.01)


def test_between_profiled_points_it_stays_between_them_and_past_them_it_grows_with_the_work():
    a = ProfiledAttention(FIXTURE / "attention.csv", LLAMA3_8B, 1)
    low, high = a([1024], [2048]), a([1088], [2176])
    assert low < a([1056], [2112]) < high                             # between two chunks and caches
    assert a([1] * 80, [496] * 80) == pytest.approx((a([1] * 64, [496] * 64) + a([1] * 96, [496] * 96)) / 2)
    assert a([1] * 64, [480] * 64) < a([1] * 64, [496] * 64) < a([1] * 64, [512] * 64)
    # past the largest batch (136) decodes scale with the KV tokens read; past the largest cache too
    assert a([1] * 272, [480] * 272) == pytest.approx(2 * a([1] * 136, [480] * 136))
    assert a([1] * 100, [1025] * 100) == pytest.approx(2 * a([1] * 100, [512] * 100), rel=0.01)
    # a chunk past the largest profiled one scales with its query-key pairs; below the smallest it is clamped
    assert a([2176], [0]) == pytest.approx(a([1088], [0]) * 2176 * 2177 / (1088 * 1089))
    assert a([16], [64]) == a([64], [64])
    # a mixed batch: its decodes as one (batch, mean context) point plus each chunk
    assert a([1, 1, 1024], [470, 490, 2048]) == pytest.approx(a([1, 1], [480, 480]) + a([1024], [2048]))


def write_grid(path: Path, kv_write: bool = True, blank_other_phase: bool = False, block_sizes=(16,),
               decodes: bool = True) -> None:
    """A Vidur-shaped attention.csv whose times are bilinear in (batch, cached) and in (chunk, cached)."""
    other = "" if blank_other_phase else "0.0"
    rows = []
    for block in block_sizes:
        for chunk in (64, 256):
            for cached in (0, 1024, 4096):
                rows.append({"time_stats.attn_prefill.median": 0.01 + 1e-7 * chunk * cached,
                             "time_stats.attn_decode.median": other, "time_stats.attn_kv_cache_save.median": 0.001,
                             "block_size": block, "batch_size": 1, "prefill_chunk_size": chunk,
                             "kv_cache_size": cached})
        for batch in (1, 8, 64) if decodes else ():
            for cached in (128, 1024):
                rows.append({"time_stats.attn_prefill.median": other, "time_stats.attn_decode.median":
                             0.02 + 1e-5 * batch * cached, "time_stats.attn_kv_cache_save.median": 0.002,
                             "block_size": block, "batch_size": batch, "prefill_chunk_size": 0,
                             "kv_cache_size": cached})
    cols = (["time_stats.attn_kv_cache_save.median"] if kv_write else []) + [
        "time_stats.attn_prefill.median", "time_stats.attn_decode.median", "n_embd", "n_q_head", "n_kv_head",
        "block_size", "num_tensor_parallel_workers", "batch_size", "prefill_chunk_size", "kv_cache_size"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, cols, extrasaction="ignore")
        w.writeheader()
        w.writerows({**r, "n_embd": 4096, "n_q_head": 32, "n_kv_head": 8, "num_tensor_parallel_workers": 1}
                    for r in rows)


def test_a_grid_without_the_kv_write_column_and_with_blank_cells_reads_as_vidur_reads_it(tmp_path):
    write_grid(tmp_path / "a.csv")
    write_grid(tmp_path / "b.csv", kv_write=False, blank_other_phase=True)      # as the FLASH_ATTENTION files
    with_write = ProfiledAttention(tmp_path / "a.csv", LLAMA3_8B, 1)
    without = ProfiledAttention(tmp_path / "b.csv", LLAMA3_8B, 1)
    assert without([1] * 8, [500] * 8) == pytest.approx((0.02 + 1e-5 * 8 * 500) / 1e3)         # bilinear: exact
    assert with_write([1] * 8, [500] * 8) == pytest.approx((0.002 + 0.02 + 1e-5 * 8 * 500) / 1e3)
    assert without([160], [2048]) == pytest.approx((0.01 + 1e-7 * 160 * 2048) / 1e3)
    assert with_write([160], [2048]) == pytest.approx((0.001 + 0.01 + 1e-7 * 160 * 2048) / 1e3)


def test_another_shape_several_block_sizes_or_no_decode_rows_are_refused(tmp_path):
    write_grid(tmp_path / "attention.csv")
    with pytest.raises(ProfileError, match="n_embd=4096 but model.hidden_size=2048"):
        ProfiledAttention(tmp_path / "attention.csv", ModelConfig(hidden_size=2048, num_attention_heads=32,
                                                                   num_key_value_heads=8), 1)
    write_grid(tmp_path / "attention.csv", block_sizes=(16, 32))
    with pytest.raises(ProfileError, match="several block_size values"):
        ProfiledAttention(tmp_path / "attention.csv", LLAMA3_8B, 1)
    write_grid(tmp_path / "attention.csv", decodes=False)
    with pytest.raises(ProfileError, match="needs both prefill .* and decode rows"):
        ProfiledAttention(tmp_path / "attention.csv", LLAMA3_8B, 1)
