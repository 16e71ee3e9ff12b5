"""What ``pip install .`` (not editable) installs: every package folder of the repository is listed in
``pyproject.toml``, so no module is left out of a wheel."""

import pathlib

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

ROOT = pathlib.Path(__file__).resolve().parent.parent


def package_names(folder: str, name: str) -> set[str]:
    """The dotted names of ``folder`` and every folder below it that holds an ``__init__.py``, ``folder`` named
    ``name``."""
    base = ROOT / folder
    return {".".join((name, *init.parent.relative_to(base).parts)) for init in base.rglob("__init__.py")}


def test_every_package_folder_is_listed_for_the_wheel():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert setup["package-dir"] == {"lookahead.cache": "cache"}
    assert set(setup["packages"]) == package_names("lookahead", "lookahead") | package_names("cache",
                                                                                              "lookahead.cache")
