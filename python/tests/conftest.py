"""Finds the built `baton` package (build/python, or $BATON_BUILD_DIR/python)
and skips the Baton tests cleanly when it was not built."""
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("BATON_BUILD_DIR", ROOT / "build"))
PYTHON_DIR = BUILD / "python"
if (PYTHON_DIR / "baton").is_dir():
    sys.path.insert(0, str(PYTHON_DIR))
