"""README's support table is what the code runs (sharpinf/model/support.py, `sharpinf models support`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sharpinf.cli import app
from sharpinf.errors import SharpinfError
from sharpinf.model.support import BEGIN, END, markdown_table, with_table

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_support_table_is_the_codes():
    text = README.read_text()
    assert text.count(BEGIN) == text.count(END) == 1
    assert with_table(text) == text, "README's support table is stale: sharpinf models support --markdown --write README.md"
    stale = text.replace("`tekken`, ", "")
    assert with_table(stale) != stale  # the check sees a name missing from the copy
    with pytest.raises(SharpinfError, match="no support table markers"):
        with_table("no table here")


def test_the_table_names_every_arch_type_and_pre_tokenizer():
    from sharpinf.model.config import SUPPORTED_ARCHS
    from sharpinf.model.pretokenizers import PRE_TOKENIZERS
    from sharpinf.model import quants

    table = markdown_table()
    assert all(f"`{a}`" in table for a in SUPPORTED_ARCHS) and all(f"`{p}`" in table for p in PRE_TOKENIZERS)
    assert all(quants.qtype_name(q) in table for q in quants.SUPPORTED)


def test_models_support_json():
    res = CliRunner().invoke(app, ["models", "support", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert [r["what"] for r in rows][:2] == ["architectures", "experts"] and all(r["checked"] for r in rows)
