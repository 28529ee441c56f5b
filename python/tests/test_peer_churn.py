"""Holders that come and go on new ports (`baton serve` processes, each
SIGKILLed once read): the engine reading from them keeps one failed path,
not one per holder it ever met (python/bench/peer_churn.py)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("baton", reason="the baton module is not built (ninja -C build baton_python)")
ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("BATON_BUILD_DIR", ROOT / "build"))
BATON = BUILD / "bin" / "baton"
CHURN = ROOT / "python" / "bench" / "peer_churn.py"


def churn(*args, timeout):
    env = dict(os.environ, BATON=str(BATON), PYTHONPATH=str(BUILD / "python"))
    return subprocess.run([sys.executable, str(CHURN), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("tcp", [False, True], ids=["same-host-copy", "tcp"])
def test_holders_on_new_ports_leave_one_failed_path(tcp):
    if not BATON.exists():
        pytest.skip("needs the built baton binary")
    run = churn("--holders", "6", *(["--tcp"] if tcp else []), timeout=120)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.splitlines()[-1])
    assert result["holders"] == 6
    assert result["paths"] == {"connecting": 0, "ready": 0, "failed": 1}


def test_bad_holder_counts_are_refused():
    run = churn("--holders", "0", timeout=60)
    assert run.returncode == 2
    assert "--holders must be at least 1" in run.stderr
