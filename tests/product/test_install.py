"""Packaging: the metadata files, one version, and a wheel that works outside the clone.

The slow tests build the wheel offline (setuptools' backend, as pip calls it without build
isolation), install it with pip into a fresh virtual environment outside the repository and use its
console script from a folder that holds nothing of the clone.
"""

import importlib.metadata
import json
import os
import re
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from PIL import Image

import scalelong
from conftest import REPO, tiny_uvit_overrides
from scalelong.metrics.fd_mnist import ASSET
from scalelong.training.config import config_to_dict, load_config
from scalelong.training.presets import PRESET_DIR, preset_names

# One worker runs this module (`--dist loadgroup`): the wheel is built once, not once per worker.
pytestmark = pytest.mark.xdist_group("test_install")

# The keys of CFF 1.2.0 at the top level; anything else is a typo that validators reject.
CFF_KEYS = {
    "abstract", "authors", "cff-version", "commit", "contact", "date-released", "doi", "identifiers",
    "keywords", "license", "license-url", "message", "preferred-citation", "references", "repository",
    "repository-artifact", "repository-code", "title", "type", "url", "version",
}  # fmt: skip
CFF_REQUIRED = {"cff-version", "message", "title", "authors"}
CFF_REFERENCE_TYPES = {"article", "book", "conference-paper", "generic", "report", "software", "thesis"}


def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    return tomllib.loads((REPO / "pyproject.toml").read_text())


# ----------------------------------------------------------------------------- metadata files


def test_version_is_written_once_and_is_the_installed_one():
    toml = pyproject()
    project = toml["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert toml["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "scalelong.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", scalelong.__version__)
    # Reinstall (pip install -e .) after changing the version if this fails.
    assert importlib.metadata.version("scalelong") == scalelong.__version__


def test_license_and_build_requirement():
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("MIT License\n\nCopyright (c) 2026 the scalelong authors\n")
    assert 'THE SOFTWARE IS PROVIDED "AS IS"' in text
    toml = pyproject()
    project = toml["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    # An SPDX license string and license-files need setuptools 77 (PEP 639).
    assert toml["build-system"]["requires"] == ["setuptools>=77"]
    assert not any(c.startswith("License ::") for c in project["classifiers"])  # refused beside SPDX
    assert project["urls"] == {
        "Paper": "https://arxiv.org/abs/2310.13545",
        "Release": "https://github.com/sail-sg/ScaleLong",
    }


def _cff_person(author: dict) -> bool:
    return isinstance(author.get("family-names"), str) or isinstance(author.get("name"), str)


def test_citation_file_is_cff_1_2_0():
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert CFF_REQUIRED <= set(cff) <= CFF_KEYS, set(cff) ^ CFF_KEYS
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
    assert all(isinstance(cff[key], str) and cff[key] for key in ("message", "title"))
    assert cff["authors"] and all(_cff_person(a) for a in cff["authors"])
    assert cff["license"] == "MIT"
    refs = {ref["url"]: ref for ref in cff["references"]}
    for ref in refs.values():
        assert ref["type"] in CFF_REFERENCE_TYPES
        assert isinstance(ref["title"], str) and isinstance(ref["year"], int)
        assert ref["authors"] and all(
            isinstance(a["given-names"], str) and isinstance(a["family-names"], str) for a in ref["authors"]
        )
        for identifier in ref.get("identifiers", []):
            assert identifier["type"] in ("doi", "url", "swh", "other") and identifier["value"]
    scalelong_paper = refs["https://arxiv.org/abs/2310.13545"]
    assert scalelong_paper["title"].startswith("ScaleLong: Towards More Stable Training of Diffusion Model")
    assert [a["family-names"] for a in scalelong_paper["authors"]] == ["Huang", "Zhou", "Yan", "Lin"]
    uvit = refs["https://arxiv.org/abs/2209.12152"]
    assert uvit["title"] == "All are Worth Words: A ViT Backbone for Diffusion Models"
    assert len(uvit["authors"]) == 7 and uvit["authors"][0] == {"given-names": "Fan", "family-names": "Bao"}


def test_changelog_has_the_unreleased_and_current_sections():
    headings = re.findall(r"^## (.+)$", (REPO / "CHANGELOG.md").read_text(), flags=re.M)
    assert headings[0] == "Unreleased"
    assert any(h.split(" - ")[0] == scalelong.__version__ for h in headings[1:]), headings


# ----------------------------------------------------------------------------- the wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built offline from a copy of the package sources.

    A copy, because building in place writes build/ and an egg-info into the clone and packs
    whatever a stale build/lib still holds. Importing torch during the build fails, so the
    version must be read from the source, not by importing scalelong.
    """
    pytest.importorskip("setuptools", minversion="77", reason="building needs setuptools >= 77")
    root = tmp_path_factory.mktemp("build")
    source = root / "scalelong"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    poison = root / "poison" / "torch"
    poison.mkdir(parents=True)
    (poison / "__init__.py").write_text("raise ImportError('building scalelong imported torch')\n")
    env = {**os.environ, "PYTHONPATH": str(poison.parent)}
    # setuptools' PEP 517 backend, called as `pip wheel --no-build-isolation` calls it (in the source
    # folder, with this environment's setuptools) but without pip's start-up: a second or two less
    build = "import sys; from setuptools import build_meta; build_meta.build_wheel(sys.argv[1])"
    proc = subprocess.run(
        [sys.executable, "-c", build, str(root / "dist")],
        cwd=source, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = (root / "dist").glob("scalelong-*.whl")
    return path


@pytest.mark.slow
def test_wheel_ships_the_classifier_presets_and_metadata(wheel):
    version = scalelong.__version__
    assert wheel.name == f"scalelong-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert z.read("scalelong/assets/fd_mnist.safetensors") == ASSET.read_bytes()
        for name in preset_names():
            assert z.read(f"scalelong/configs/{name}.yaml") == (PRESET_DIR / f"{name}.yaml").read_bytes()
        info = f"scalelong-{version}.dist-info"
        metadata = z.read(f"{info}/METADATA").decode()
        entry_points = z.read(f"{info}/entry_points.txt").decode()
        assert z.read(f"{info}/licenses/LICENSE") == (REPO / "LICENSE").read_bytes()
    # Only the package and its metadata: no tests, benchmarks or configs at the top level.
    assert {n.split("/")[0] for n in names} == {"scalelong", info}
    assert f"\nVersion: {version}\n" in metadata and "\nLicense-Expression: MIT\n" in metadata
    assert "Project-URL: Paper, https://arxiv.org/abs/2310.13545" in metadata
    assert "scalelong = scalelong.cli:run" in entry_points


def _fresh_venv(path: Path) -> Path:
    """A virtual environment at ``path`` whose dependencies are this environment's packages.

    A ``.pth`` line adds this environment's site-packages to ``sys.path`` (torch is not installed
    again). The ``.pth`` files found there are not processed, since only site directories' are,
    so the clone's editable install does not reach the new environment.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=600)
    python = path / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=600,
    ).stdout.strip()  # fmt: skip
    (Path(purelib) / "_scalelong_test_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


# `python -c` this, SCRIPT and a JSON list of argument lists: SCRIPT (the installed console script)
# run once for each, all in this one Python process (each run would import torch on its own:
# seconds apiece); the last line printed: a JSON list of [exit code, stdout, stderr] per run.
RUN_CONSOLE_SCRIPT = """
import contextlib, io, json, runpy, sys

script, commands = sys.argv[1], json.loads(sys.argv[2])
results = []
for argv in commands:
    sys.argv = [script, *argv]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:
            code = 0 if e.code is None else e.code
    results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


@pytest.mark.slow
def test_installed_wheel_trains_and_samples_outside_the_clone(wheel, tmp_path):
    venv = tmp_path / "venv"
    python = _fresh_venv(venv)
    work = tmp_path / "work"  # the working folder: nothing of the clone in it or on the path
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"

    def run(*args) -> str:
        proc = subprocess.run(
            [str(a) for a in args], cwd=work, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    def scalelong_cli(*commands: list) -> list[str]:
        """The installed console script run with each argument list, in one Python process: the
        output of each (each must exit 0)."""
        argvs = [[str(a) for a in command] for command in commands]
        printed = run(python, "-c", RUN_CONSOLE_SCRIPT, venv / "bin" / "scalelong", json.dumps(argvs))
        results = json.loads(printed.splitlines()[-1])
        for argv, (code, out, err) in zip(argvs, results, strict=True):
            assert code == 0, f"scalelong {' '.join(argv)}: {out}{err}"
        return [out for _, out, _ in results]

    probe = "import scalelong, importlib.metadata as m; print(scalelong.__file__, m.version('scalelong'))"
    before = subprocess.run([python, "-c", probe], cwd=work, env=env, capture_output=True, text=True)
    assert "No module named 'scalelong'" in before.stderr  # the editable clone is out of reach
    run(python, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", wheel)

    where, version = run(python, "-c", probe).split()
    assert Path(where).is_relative_to(venv) and version == scalelong.__version__
    # the console script pip wrote runs with the new environment's Python
    assert (venv / "bin" / "scalelong").read_text().startswith(f"#!{python}\n")
    run_dir = work / "runs" / "tiny"
    overrides = [*tiny_uvit_overrides("tiny", work / "runs", steps=3), "diagnostics.noise_levels=0"]
    sampling = ["--steps", 2, "--no-progress"]
    listing, _, _, scored = scalelong_cli(
        ["configs"],
        ["train", "demo_uvit", *overrides, "--no-progress"],
        ["sample", run_dir, "--n", 2, "--out", work / "samples", *sampling],
        ["eval", run_dir, "--n", 4, "--metric", "fd-mnist", *sampling],
    )
    assert all(re.search(rf"^{name} ", listing, flags=re.M) for name in preset_names())
    assert str(venv) in listing  # the presets are the installed ones

    assert json.loads((run_dir / "summary.json").read_text())["status"] == "complete"
    assert (run_dir / "checkpoints" / "step-000003" / "ema.safetensors").is_file()
    stored = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert stored == config_to_dict(load_config("configs/demo_uvit.yaml", overrides))  # the clone's recipe

    with Image.open(work / "samples" / "000001.png") as image:
        assert image.size == (32, 32)
    # FD-MNIST reads the digit classifier shipped in the installed package.
    assert float(re.match(r"fd-mnist (\S+) ", scored).group(1)) > 0
