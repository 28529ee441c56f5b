"""python/examples/kv_connector.py runs end to end: two processes, paged KV in
torch tensors, loaded per layer with deadlines and saved back, verified."""
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("baton", reason="the baton module is not built (ninja -C build baton_python)")
pytest.importorskip("torch")

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "kv_connector.py"


def test_kv_connector_example_moves_and_verifies_paged_kv():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "loaded and verified" in r.stdout
    assert "prefill: saved req-0 layer 3 verified" in r.stdout
    assert r.stdout.strip().endswith("verified")
