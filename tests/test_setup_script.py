"""scripts/setup-and-demo checks what it needs before its long install, and names what is missing:
Java for Spark, and a Python that can create a virtual environment (python3-venv)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "setup-and-demo"


def setup_and_demo(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The script, copied into a folder of its own: whatever it would create lands there."""
    (tmp_path / "scripts").mkdir(exist_ok=True)
    shutil.copy(SCRIPT, tmp_path / "scripts" / "setup-and-demo")
    environment = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PYTHON")}
    return subprocess.run(
        ["bash", str(tmp_path / "scripts" / "setup-and-demo"), *args],
        env={**environment, "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_no_java_is_named_with_how_to_get_it_before_anything_is_installed(tmp_path):
    java_home = tmp_path / "jdk"
    java_home.mkdir()
    done = setup_and_demo(tmp_path, JAVA_HOME=str(java_home))
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("setup-and-demo: the demo needs Spark, which needs Java 17: ")
    assert f"JAVA_HOME={java_home} holds no bin/java" in done.stderr
    assert "apt-get install openjdk-17-jre-headless" in done.stderr and "--no-spark" in done.stderr
    assert not (tmp_path / ".venv").exists()


@pytest.mark.parametrize(
    ("says", "version"),
    [('openjdk version "11.0.2" 2019-01-15', "11.0.2"), ('java version "1.8.0_292"', "1.8.0")],
)
def test_a_java_older_than_17_is_refused(tmp_path, says, version):
    java_home = tmp_path / "jdk"
    executable(java_home / "bin" / "java", f"#!/bin/sh\necho '{says}' >&2\n")
    done = setup_and_demo(tmp_path, JAVA_HOME=str(java_home))
    assert done.returncode == 1, done.stderr
    assert f"needs Java 17 or 21: {java_home}/bin/java is Java {version}." in done.stderr
    assert not (tmp_path / ".venv").exists()


def test_a_python_without_venv_support_is_named_with_the_package_to_install(tmp_path):
    # Python as Debian ships it without python3-venv: no ensurepip, so `python3 -m venv` fails.
    python = executable(
        tmp_path / "bin" / "python3",
        "#!/bin/sh\n"
        'case "$*" in *ensurepip*) echo "No module named ensurepip" >&2; exit 1;; esac\n'
        f'exec {sys.executable} "$@"\n',
    )
    done = setup_and_demo(tmp_path, PYTHON=str(python))
    assert done.returncode == 1, done.stderr
    minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert "cannot create a virtual environment" in done.stderr
    assert f"apt-get install python3-venv, or python{minor}-venv" in done.stderr
    assert not (tmp_path / ".venv").exists()


def test_an_unknown_argument_is_refused(tmp_path):
    done = setup_and_demo(tmp_path, "--spark")
    assert done.returncode == 2 and "the only one is --no-spark" in done.stderr


def test_the_readme_names_what_the_script_checks_and_how_to_call_the_commands():
    readme = (SCRIPT.parents[1] / "README.md").read_text()
    for needed in ("python3-venv", "openjdk-17-jre-headless", "--no-spark", "JAVA_HOME"):
        assert needed in readme, needed
    assert '.venv/bin/python -m pytest -m "not slow and not spark"' in readme
    assert ".venv/bin/flowwarden" in readme and "source .venv/bin/activate" in readme
    assert "`embedded-mongo` keeps its data in memory only" in readme
