"""Every option is declared once (its model) and documented: the reference page is written from
the models and must be current; the streaming source's options are in docs/spark.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flowwarden.config.reference import DECORATOR_MODELS, render

ROOT = Path(__file__).resolve().parents[2]


def test_the_options_reference_is_written_from_the_models() -> None:
    page = (ROOT / "docs" / "options.md").read_text()
    assert page == render(), (
        "docs/options.md is stale: run `python -m flowwarden.config.reference > docs/options.md`"
    )


@pytest.mark.parametrize("model", DECORATOR_MODELS, ids=lambda model: model.__name__)
def test_every_option_says_what_it_does(model) -> None:
    for name in model.option_names():
        assert model.option_field(name).description, f"{model.__name__}.{name} has no description"


def test_every_source_option_is_in_the_spark_guide() -> None:
    pytest.importorskip("pyspark")
    from flowwarden.spark.source.parsing import KNOWN

    guide = (ROOT / "docs" / "spark.md").read_text()
    rows = set(re.findall(r"^\| `([a-z_]+)`(?:, `([a-z_]+)`)? \|", guide, flags=re.M))
    documented = {name for row in rows for name in row if name}
    assert KNOWN - {"path"} <= documented, sorted(KNOWN - {"path"} - documented)


def test_the_readme_links_the_reference() -> None:
    assert "docs/options.md" in (ROOT / "README.md").read_text()
