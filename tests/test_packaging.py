"""What ``pip install`` of the project's wheel holds: pyproject.toml names its packages one by one, and a
package left out still imports from a checkout (installed editable), so only the wheel would miss it, as it
once missed ``hydra/sweeper=pbt``."""
import tomllib
from pathlib import Path

from conftest import ROOT

# the tree's folders of packages and the names they install under
FOLDERS = {"fiberrl": "fiberrl", "algos": "fiberrl.algos", "hydra_plugins": "hydra_plugins"}


def test_every_package_in_the_tree_is_in_the_wheel():
    setuptools = tomllib.loads((Path(ROOT) / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    for folder, name in FOLDERS.items():
        assert setuptools["package-dir"].get(name, folder) == folder
        for init in sorted((Path(ROOT) / folder).rglob("__init__.py")):
            package = ".".join([name, *init.parent.relative_to(Path(ROOT) / folder).parts])
            assert package in listed, f"{init.parent}: the wheel leaves it out; add {package} to pyproject.toml"
