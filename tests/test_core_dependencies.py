"""flowwarden needs only its core dependencies; the test double is the ``flowwarden-embedded``
distribution, which the ``embedded`` extra brings.

Every check runs in a fresh interpreter in which flowwarden_embedded, mongomock and google_crc32c
cannot be imported, as after ``pip install flowwarden`` without the extra.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

PIP_LINE = 'pip install "flowwarden[embedded]"'

# Installed first in each interpreter: every import of the extra's packages fails, as if absent.
WITHOUT_THE_EXTRA = textwrap.dedent(
    """
    import sys

    class _WithoutTheEmbeddedExtra:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in ("flowwarden_embedded", "mongomock", "google_crc32c"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _WithoutTheEmbeddedExtra())
    """
)


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_THE_EXTRA + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m flowwarden.cli <args>`` without the extra."""
    return _python(
        f"""
        import runpy
        sys.argv = ["flowwarden", *{list(args)!r}]
        runpy.run_module("flowwarden.cli", run_name="__main__")
        """
    )


def test_every_module_outside_the_test_double_imports_without_the_extra() -> None:
    done = _python(
        """
        import importlib
        import pkgutil

        import flowwarden
        from flowwarden import Connector

        for module in pkgutil.walk_packages(flowwarden.__path__, "flowwarden."):
            if not module.name.startswith("flowwarden_embedded"):
                importlib.import_module(module.name)
        print(sorted(m for m in sys.modules if m.partition(".")[0] in ("mongomock", "google_crc32c")))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_flowwarden_run_works_without_the_extra() -> None:
    done = _cli("run", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: flowwarden run")


def test_the_test_double_names_the_pip_line_to_run() -> None:
    done = _python(
        """
        import flowwarden.testing
        from flowwarden.errors import MissingDependencyError

        try:
            from flowwarden.testing import EmbeddedReplicaSet
        except MissingDependencyError as error:
            print(error)
        else:
            print("imported")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "flowwarden.testing.EmbeddedReplicaSet needs flowwarden-embedded, which is not installed. "
        f"Install it with: {PIP_LINE}"
    )


@pytest.mark.slow
def test_the_flowwarden_wheel_carries_none_of_the_test_double(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), str(root)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("flowwarden-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(name.startswith("flowwarden/runtime/") for name in names)
    leaked = [n for n in names if n.startswith(("flowwarden_embedded", "flowwarden/testing/embedded"))]
    assert not leaked, leaked
    assert "flowwarden/testing/__init__.py" in names  # the re-export that names the extra


def test_the_commands_on_the_test_double_say_what_to_install(tmp_path: Path) -> None:
    for args in (("embedded-mongo", "--port", "27017"), ("demo", "--no-spark", "--output", str(tmp_path))):
        done = _cli(*args)
        assert done.returncode == 2, (args, done.stderr)
        (line,) = done.stderr.splitlines()
        assert line.startswith("flowwarden: ") and line.endswith(PIP_LINE), line


def test_the_version_has_one_source() -> None:
    import importlib.metadata

    import flowwarden

    assert importlib.metadata.version("flowwarden") == flowwarden.__version__
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and 'attr = "flowwarden.__version__"' in pyproject
