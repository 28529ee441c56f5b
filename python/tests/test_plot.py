"""Tests for scripts/plot: run it as a subprocess on small hand-made documents."""
import json
import pathlib
import subprocess

PLOT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "plot"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

WORKLOAD = {
    "topology": "nvswitch8", "link": "gpu0->gpu1",
    "prefill": {"request_bytes": 32 << 20, "burst": 64, "mean_burst_interval_us": 10000.0},
    "decode": {"request_bytes": 256 << 10, "mean_interval_us": 100.0, "deadline_us": 2000.0},
    "duration_ms": 10.0, "seed": 1,
}


def policy(lo, hi, miss):
    cdf = [lo + (hi - lo) * (i / 100) ** 3 for i in range(101)]
    return {"decode_critical": {"count": 100, "p50_us": cdf[50], "p99_us": cdf[99],
                                "miss_ratio": miss, "cdf_us": cdf}}


MIXED = {"workload": WORKLOAD,
         "policies": {"deadline_aware": policy(4.8, 7.0, 0.0),
                      "baseline_fifo": policy(4.8, 15000.0, 0.6)},
         "decode_p99_reduction": 0.99}

ABLATION = {"workload": WORKLOAD, "path": "nvswitch", "cells": [
    {"slice_bytes": s, "inflight_bytes": b, "decode_p99_us": 5.0 + s / b,
     "decode_miss_ratio": 0.0, "prefill_throughput_gbps": 100.0 * b / s, "bytes_wasted": 0}
    for s in (64 << 10, 1 << 20) for b in (1 << 20, 4 << 20) if s <= b
] + [{"slice_bytes": 4 << 20, "inflight_bytes": 1 << 20,
      "skipped": "budget smaller than one slice"},
     {"slice_bytes": 4 << 20, "inflight_bytes": 4 << 20, "decode_p99_us": 9.0,
      "decode_miss_ratio": 0.0, "prefill_throughput_gbps": 350.0, "bytes_wasted": 0}]}


def run(*args):
    return subprocess.run([str(PLOT), *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def write(tmp_path, doc, name="result.json"):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 10_000


def test_mixed_draws_a_png(tmp_path):
    out = tmp_path / "mixed.png"
    r = run(write(tmp_path, MIXED), out)
    assert r.returncode == 0, r.stderr
    assert_png(out)


def test_mixed_without_reduction_still_draws(tmp_path):
    doc = {k: v for k, v in MIXED.items() if k != "decode_p99_reduction"}
    out = tmp_path / "mixed.png"
    r = run(write(tmp_path, doc), out)
    assert r.returncode == 0, r.stderr
    assert_png(out)


def test_ablation_with_a_skipped_cell_draws_a_png(tmp_path):
    out = tmp_path / "ablation.png"
    r = run(write(tmp_path, ABLATION), out)
    assert r.returncode == 0, r.stderr
    assert_png(out)


def test_unknown_shape_exits_2_naming_keys(tmp_path):
    out = tmp_path / "x.png"
    r = run(write(tmp_path, {"frobs": [], "widgets": 3}), out)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "frobs" in lines[0] and "widgets" in lines[0]
    assert "policies" in lines[0] and "cells" in lines[0]  # the shapes it knows
    assert not out.exists()


def test_non_object_json_is_an_unknown_shape(tmp_path):
    r = run(write(tmp_path, [1, 2, 3]), tmp_path / "x.png")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1


def test_invalid_json_exits_1(tmp_path):
    out = tmp_path / "x.png"
    r = run(write(tmp_path, "{not json"), out)
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_missing_file_exits_1(tmp_path):
    r = run(tmp_path / "absent.json", tmp_path / "x.png")
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1


def test_wrong_argument_count_prints_usage(tmp_path):
    for args in [(), (write(tmp_path, MIXED),), ("a", "b", "c")]:
        r = run(*args)
        assert r.returncode == 2
        assert "usage" in r.stderr


def test_mlu_sweep_draws_a_png(tmp_path):
    def row(deadline_us, mlu, feasible, fifo, edf, drop, signalled):
        return {"deadline_us": deadline_us, "count": 100, "mean_mlu": mlu, "feasible_rate": feasible,
                "attainment": {"fifo": fifo, "edf": edf, "edf_drop": drop},
                "signalled": {"fifo": 0.0, "edf": 0.0, "edf_drop": signalled}}
    doc = {"workload": {"topology": "pcie4", "path": "gpu0->gpu1", "request_bytes": 1048576, "batch": 8,
                        "streams": 2},
           "rows": [row(60, 9.9, 0.01, 0.01, 0.01, 0.11, 0.88), row(500, 8.1, 0.16, 0.17, 0.13, 0.67, 0.33),
                    row(5e6, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0)]}
    out = tmp_path / "mlu.png"
    r = run(write(tmp_path, doc), out)
    assert r.returncode == 0, r.stderr
    assert_png(out)


def test_fault_timeline_draws_a_png(tmp_path):
    timeline = [{"id": i + 1, "start_us": 200.0 * i, "end_us": 200.0 * i + (60.0 if 60 <= i < 130 else 5.0),
                 "leg": "store" if 66 <= i < 134 else "direct", "status": "completed",
                 "failovers": 1 if i == 66 else 0} for i in range(200)]
    timeline[100]["status"] = "failed"
    doc = {"requests": 200, "completed": 199, "dropped": 1, "recovery_us": 48.5,
           "returned_to_direct_at_us": 26805.0, "kill_at_us": 13300.0, "restore_at_us": 26700.0,
           "strategy": "failover_only",
           "workload": {"direct": "gpu0->gpu1", "store": "nic1->gpu1", "handoff_bytes": 1 << 20},
           "timeline": timeline}
    out = tmp_path / "fault.png"
    r = run(write(tmp_path, doc), out)
    assert r.returncode == 0, r.stderr
    assert_png(out)


def test_fault_timeline_without_recovery_still_draws(tmp_path):
    doc = {"requests": 1, "completed": 1, "dropped": 0, "recovery_us": None, "returned_to_direct_at_us": None,
           "kill_at_us": 10.0, "restore_at_us": 20.0,
           "timeline": [{"id": 1, "start_us": 1.0, "end_us": 3.0, "leg": "direct", "status": "completed"}]}
    out = tmp_path / "fault.png"
    r = run(write(tmp_path, doc), out)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_dualpath_draws_a_png(tmp_path):
    lat = {"p50": 3.1, "p95": 4.0, "p99": 5.2}
    doc = {"requests": 200, "strategy": "hedge", "wins": {"direct": 200, "store": 0}, "cancelled_legs": 200,
           "latency_us": {"racing": lat, "direct_only": lat, "store_only": {"p50": 46.0, "p95": 80.0, "p99": 120.0}},
           "wasted_bytes": 1 << 20, "workload": {"handoff_bytes": 1 << 20}}
    out = tmp_path / "dualpath.png"
    r = run(write(tmp_path, doc), out)
    assert r.returncode == 0, r.stderr
    assert_png(out)


MATRIX = {"bench": "matrix", "gpus": [0, 1], "block_bytes": 64 << 20, "repeat": 10, "paths": [
    {"from": "gpu0", "to": "gpu1", "kind": "peer", "path": "nvlink", "measured_gbps": 380.0,
     "model_gbps": 450.0},
    {"from": "gpu0", "to": "gpu1", "kind": "staging", "path": "host_staging", "measured_gbps": 20.0,
     "model_gbps": 24.0},
    {"from": "numa0", "to": "gpu0", "kind": "h2d", "path": "host_staging", "measured_gbps": 53.0,
     "model_gbps": 24.0},
    {"from": "gpu0", "to": "gpu0", "kind": "d2d", "path": "copy", "measured_gbps": 1800.0,
     "model_gbps": None}]}


def test_matrix_draws_a_heatmap(tmp_path):
    out = tmp_path / "matrix.png"
    r = run(write(tmp_path, MATRIX), out)
    assert r.returncode == 0, r.stderr
    assert_png(out)
