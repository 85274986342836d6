"""Execute every notebooks/*.ipynb (stored without outputs) and fail on any cell error,
so `make test` keeps the notebooks fresh. The kernel is this interpreter (the venv's),
through a kernelspec written to a temp dir, whatever `python3` kernels are installed."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
KERNEL = "sharpinf-test-python"


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory):
    spec_dir = tmp_path_factory.mktemp("jupyter") / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "sharpinf test (this interpreter)",
        "language": "python",
        "env": {"MPLBACKEND": "Agg"},
    }))
    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = os.pathsep.join([str(spec_dir.parents[1])] + ([old] if old else []))
    yield KERNEL
    if old is None:
        os.environ.pop("JUPYTER_PATH", None)
    else:
        os.environ["JUPYTER_PATH"] = old


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/*.ipynb missing"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, kernel_name):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{path.name}: store it without outputs"
    client = nbclient.NotebookClient(nb, kernel_name=kernel_name, timeout=300,
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()  # raises CellExecutionError (with the cell and traceback) on any error
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
