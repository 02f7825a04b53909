"""Where MNIST goes when no data_dir is given: a checkout's MNIST_data/, else ./MNIST_data,
else the user's cache; never inside site-packages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tensorspark.datasets import mnist
from tensorspark.datasets.location import default_mnist_dir, source_checkout, user_cache_dir

ROOT = Path(__file__).resolve().parents[3]


def checkout(tmp_path: Path, project: str = "tensorspark") -> Path:
    """A source tree: pyproject.toml naming ``project`` beside the package folder."""
    root = tmp_path / "src"
    (root / "tensorspark").mkdir(parents=True)
    (root / "pyproject.toml").write_text(f'[project]\nname = "{project}"\nversion = "0.1.0"\n')
    return root / "tensorspark"


def site_packages(tmp_path: Path) -> Path:
    package = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "tensorspark"
    package.mkdir(parents=True)
    return package


def test_a_checkout_uses_its_own_folder_even_when_the_working_directory_has_one(
    tmp_path: Path,
) -> None:
    package = checkout(tmp_path)
    cwd = tmp_path / "work"
    (cwd / "MNIST_data").mkdir(parents=True)
    environ = {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    assert source_checkout(package) == tmp_path / "src"
    assert default_mnist_dir(package, cwd, environ) == tmp_path / "src" / "MNIST_data"


def test_another_projects_pyproject_is_not_a_checkout(tmp_path: Path) -> None:
    package = checkout(tmp_path, project="someone-else")
    environ = {"HOME": str(tmp_path / "home")}
    assert source_checkout(package) is None
    assert default_mnist_dir(package, tmp_path, environ) == (
        tmp_path / "home" / ".cache" / "tensorspark" / "MNIST_data"
    )


def test_installed_uses_the_working_directorys_mnist_data_when_it_exists(tmp_path: Path) -> None:
    package = site_packages(tmp_path)
    cwd = tmp_path / "work"
    (cwd / "MNIST_data").mkdir(parents=True)
    environ = {"HOME": str(tmp_path / "home")}
    assert default_mnist_dir(package, cwd, environ) == cwd / "MNIST_data"


def test_installed_uses_the_xdg_cache_otherwise_and_creates_nothing(tmp_path: Path) -> None:
    package = site_packages(tmp_path)
    cwd = tmp_path / "work"
    cwd.mkdir()
    (cwd / "MNIST_data").write_text("a file, not a folder")
    environ = {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    before = sorted(tmp_path.rglob("*"))
    assert (
        default_mnist_dir(package, cwd, environ) == tmp_path / "xdg" / "tensorspark" / "MNIST_data"
    )
    assert (
        default_mnist_dir(package, None, environ) == tmp_path / "xdg" / "tensorspark" / "MNIST_data"
    )
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize("xdg", [None, "", "relative/cache"])
def test_an_unset_empty_or_relative_xdg_cache_home_means_dot_cache(
    tmp_path: Path, xdg: str | None
) -> None:
    environ = {"HOME": str(tmp_path / "home")}
    if xdg is not None:
        environ["XDG_CACHE_HOME"] = xdg
    assert user_cache_dir(environ) == tmp_path / "home" / ".cache" / "tensorspark"


def test_this_checkout_keeps_its_mnist_data_folder() -> None:
    assert mnist.MNIST_DIR == ROOT / "MNIST_data"


def test_an_installed_copy_never_points_inside_site_packages(tmp_path: Path) -> None:
    # The real datasets modules, laid out as a wheel installs them (a stub package __init__,
    # so the test does not depend on the rest of the package).
    target = tmp_path / "site-packages"
    package = target / "tensorspark"
    for folder in ("datasets", "fileio"):  # fileio: the idx format the data sets parse with
        shutil.copytree(
            ROOT / "tensorspark" / folder,
            package / folder,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    shutil.copy(ROOT / "tensorspark" / "errors.py", package / "errors.py")
    (package / "__init__.py").write_text("")
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XDG_CACHE_HOME")}
    env.update(PYTHONPATH=str(target), HOME=str(tmp_path / "home"))
    script = "import tensorspark.datasets.mnist as m; print(m.__file__); print(m.MNIST_DIR)"

    def default_dir() -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", script],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout.splitlines()

    module_file, folder = default_dir()
    assert module_file.startswith(str(package))
    assert folder == str(tmp_path / "home" / ".cache" / "tensorspark" / "MNIST_data")
    (work / "MNIST_data").mkdir()
    assert default_dir()[1] == str(work / "MNIST_data")
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    (work / "MNIST_data").rmdir()
    assert default_dir()[1] == str(tmp_path / "xdg" / "tensorspark" / "MNIST_data")
    assert not (package / "MNIST_data").exists() and not (target / "MNIST_data").exists()
