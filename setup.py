"""Maps the top-level folders engine/, sidecar/ and operator/ to kvloop.engine, kvloop.sidecar and
kvloop.operator, listing every subpackage so editable installs and wheels see the same tree.
(A bare top-level `operator` package would shadow the standard library.)"""

from pathlib import Path

from setuptools import find_packages, setup

ROOTS = {"kvloop.engine": "engine", "kvloop.sidecar": "sidecar", "kvloop.operator": "operator"}

package_dir: dict[str, str] = {}
packages: list[str] = []
for name, folder in ROOTS.items():
    package_dir[name] = folder
    packages.append(name)
    for sub in find_packages(where=folder):
        packages.append(f"{name}.{sub}")
        package_dir[f"{name}.{sub}"] = str(Path(folder, *sub.split(".")))

# The CPU kernels' C++ sources ship with the package: they are compiled on the machine that runs them.
setup(package_dir=package_dir, packages=packages,
      package_data={"kvloop.engine.kernels.cpu": ["csrc/*.cpp", "csrc/*.h"]})
