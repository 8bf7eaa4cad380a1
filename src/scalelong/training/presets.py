"""Presets: the YAML recipes shipped inside the package, selected by name.

Every command that takes a config (``train``, ``info``, ``compare``, ``sweep``, ``fid-stats``) and
:func:`scalelong.load_config` accept either a path or a preset name::

    scalelong train demo                      # the packaged demo recipe, from any folder
    scalelong train my/recipe.yaml            # a file of your own
    scalelong configs                         # the presets, one line each

A file that exists always wins, so a ``demo`` file in the working folder is read rather than the
preset. A preset's description is the first line of its file's leading comment. To start a recipe
of your own, copy a preset from :data:`PRESET_DIR` and pass the copy's path.
"""

from __future__ import annotations

from pathlib import Path

from scalelong.errors import ScaleLongError

PRESET_DIR = Path(__file__).parents[1] / "configs"  # shipped as package data (pyproject.toml)
SUFFIX = ".yaml"


def preset_names() -> list[str]:
    """The names of the shipped presets, sorted: the file names without ``.yaml``."""
    return sorted(path.stem for path in PRESET_DIR.glob(f"*{SUFFIX}"))


def preset_path(name: str) -> Path:
    """The YAML file of preset ``name``; an unknown name is a :class:`ScaleLongError` listing them."""
    if name not in preset_names():
        raise ScaleLongError(f"unknown preset {name!r}; presets: {', '.join(preset_names())}")
    return PRESET_DIR / f"{name}{SUFFIX}"


def preset_description(name: str) -> str:
    """The first line of the preset's leading comment, or ``""`` when the file opens with YAML."""
    for line in preset_path(name).read_text().splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        return stripped.lstrip("#").strip() if stripped.startswith("#") else ""
    return ""


def presets() -> dict[str, str]:
    """Every preset's name and one-line description, sorted by name."""
    return {name: preset_description(name) for name in preset_names()}


def resolve_config(config: str | Path) -> Path:
    """The YAML file a config argument names: an existing path, else a preset.

    A string without a folder or a suffix (``"demo"``) that is no file names a preset; anything
    else (a :class:`~pathlib.Path`, ``"configs/demo.yaml"``) must be a file. Both mistakes are one
    :class:`ScaleLongError` line: an unknown name lists the presets, a missing file says so (and,
    when its name is a preset's, how to use the preset instead).
    """
    path = Path(config)
    if path.exists():
        return path
    if isinstance(config, str) and _is_bare_name(config):
        if config in preset_names():
            return preset_path(config)
        raise ScaleLongError(
            f"{config!r} is neither a config file nor a preset; presets: {', '.join(preset_names())} "
            "(`scalelong configs` describes them)"
        )
    hint = ""
    if path.suffix == SUFFIX and path.stem in preset_names():
        hint = f"; for the preset shipped with scalelong, pass its name: {path.stem}"
    raise ScaleLongError(f"config file not found: {config}{hint}")


def _is_bare_name(config: str) -> bool:
    """``demo`` is a name; ``demo.yaml``, ``./demo`` and ``configs/demo`` are paths."""
    path = Path(config)
    return bool(config) and path.name == config and not path.suffix and config not in (".", "..")
