"""Build the front end into the package: ``npm ci`` from the lockfile, then ``npm run build``.

hatch-jupyter-builder calls ``build`` while hatch builds a wheel or an
editable install (see pyproject.toml). Its own ``npm_builder`` runs
``npm install``, which may update the lockfile rather than install from it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from hatch_jupyter_builder.utils import is_stale


def build(
    target_name: str,
    version: str,
    path: str = "js",
    source_dir: str | None = None,
    build_dir: str | None = None,
    build_cmd: str = "build",
) -> None:
    """Install the locked Node packages if needed, then build the widget and the labextension."""
    if os.environ.get("HATCH_JUPYTER_BUILDER_SKIP_NPM") == "1":
        return
    if source_dir and build_dir and not is_stale(build_dir, source_dir):
        return
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(
            "Building jupyter_agentruns from source needs Node.js 20 or later with npm on PATH "
            "(a wheel from PyPI needs neither)."
        )
    package = Path(path).resolve()
    installed = package / "node_modules" / ".package-lock.json"
    lock = package / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=package, check=True)
    subprocess.run([npm, "run", build_cmd], cwd=package, check=True)
