"""Build the notebooks (stored without outputs): python notebooks/make_notebooks.py

tests/test_notebooks.py executes every notebooks/*.ipynb, so they stay fresh with `make test`.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_notebook

HERE = Path(__file__).resolve().parent


def build() -> dict[str, nbformat.NotebookNode]:
    from anatomy_cells import ANATOMY  # notebooks/ is this script's folder
    from packed_step_cells import PACKED_STEP
    from moe_cells import MOE_NB
    from gpt_oss_cells import GPT_OSS_NB
    from variants_cells import VARIANTS_NB

    out = {}
    for name, cells in (("01_packed_step.ipynb", PACKED_STEP), ("02_anatomy_of_a_step.ipynb", ANATOMY),
                        ("03_from_simple_to_fast.ipynb", VARIANTS_NB), ("04_mixture_of_experts.ipynb", MOE_NB),
                        ("05_gpt_oss.ipynb", GPT_OSS_NB)):
        nb = new_notebook(cells=cells)
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.metadata["language_info"] = {"name": "python"}
        out[name] = nb
    return out


def main() -> None:
    for name, nb in build().items():
        nbformat.validate(nb)
        nbformat.write(nb, HERE / name)
        print("wrote", HERE / name)


if __name__ == "__main__":
    main()
