"""The package as a user gets it: ``python -m build`` makes a wheel and an sdist, the wheel installs
into a fresh virtual environment (no torch, nothing of this checkout) and its command runs.

Needs the package index for the core's dependencies (numpy, rich, highspy), as any install does.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import shardlayout

ROOT = Path(__file__).resolve().parent.parent


def _run(*argv, cwd=None) -> str:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=cwd)
    assert done.returncode == 0, f"{' '.join(map(str, argv))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_wheel_installs_into_a_fresh_venv_and_runs(tmp_path):
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, ROOT)
    version = shardlayout.__version__
    wheel, sdist = dist / f"shardlayout-{version}-py3-none-any.whl", dist / f"shardlayout-{version}.tar.gz"
    assert wheel.exists() and sdist.exists(), sorted(p.name for p in dist.iterdir())

    names = zipfile.ZipFile(wheel).namelist()
    assert "shardlayout/cli.py" in names and "shardlayout/run/parallel.py" in names
    assert not any(n.startswith(("tests/", "benchmarks/", "docs/")) for n in names), "the wheel ships only the package"
    assert f"shardlayout-{version}/README.md" in tarfile.open(sdist).getnames()

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    py = venv / "bin" / "python"
    # this environment's pip installs into the fresh one (--python), so the fresh one needs no pip of its own
    _run(sys.executable, "-m", "pip", "--python", py, "install", "-q", "--disable-pip-version-check", wheel)
    assert "torch" not in _run(py, "-c", "import sys, shardlayout; print(sorted(sys.modules))"), \
        "the core imports torch"
    where = _run(py, "-c", "import shardlayout; print(shardlayout.__file__)")
    assert str(venv) in where, f"shardlayout imported from {where}, not the fresh venv"

    exe = venv / "bin" / "shardlayout"
    assert _run(exe, "--version", cwd=tmp_path).strip() == f"shardlayout {version}"
    demo = _run(exe, "demo", cwd=tmp_path)
    assert "verified: every rank simulated in numpy; all 100 tensors equal the unsharded run" in demo
