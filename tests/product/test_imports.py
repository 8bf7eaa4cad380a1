"""The import graph of the package: no cycle, counting imports inside functions too.

Every module under src/scalelong is parsed with ``ast`` (nothing is imported), so a cycle that
hides behind a function-level import fails here as surely as one at the top of a file.
Importing ``a.b.c`` also runs the package ``a.b``; that implicit edge counts too, except for
the root package ``scalelong`` whose ``__init__`` only re-exports the public names, and for a
module's own packages (they have started importing before the module's first line runs).
"""

import ast
import json
import subprocess
import sys

import pytest

import scalelong
from import_fixtures import ROOT, SOURCE, find_cycle, import_graph, imported


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert {
        "scalelong.training.config",
        "scalelong.training.train",
        "scalelong.training.runs",
        "scalelong.cli",
    } <= set(graph)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_a_cycle_is_found_and_named():
    """Negative controls: the finder sees a cycle, also one made by an import inside a function."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    known = {"scalelong.training.config", "scalelong.sampling", "scalelong.models", "scalelong.models.uvit"}
    lazy = "def validate():\n    from scalelong.sampling import SAMPLERS\n"
    assert imported(lazy, "scalelong.training.config", False, known) == {"scalelong.sampling"}
    relative = "from .uvit import UViT\n"
    assert imported(relative, "scalelong.models", True, known) == {"scalelong.models.uvit"}
    graph = {"scalelong.training.config": imported(lazy, "scalelong.training.config", False, known)}
    graph["scalelong.sampling"] = imported(
        "from scalelong.training.config import Config", "scalelong.sampling", False, known
    )
    assert find_cycle(graph) == [
        "scalelong.sampling",
        "scalelong.training.config",
        "scalelong.sampling",
    ]


@pytest.mark.parametrize("module", ["scalelong.models.uvit", "scalelong.models.unet"])
def test_backbones_import_only_the_skip_module(module):
    assert import_graph()[module] <= {"scalelong.skips", "scalelong.errors"}


def test_config_imports_no_feature_module():
    # the schema names samplers and metrics itself; it may ask the UNet which sizes fit
    assert import_graph()["scalelong.training.config"] <= {
        "scalelong.errors",
        "scalelong.skips",
        "scalelong.models",
        "scalelong.models.unet",
        "scalelong.training.presets",  # the shipped recipes by name; imports only errors (test_presets.py)
        "scalelong.metrics",  # METRIC_NAMES, without the metrics' own modules
        "scalelong.runlog",  # RunLog on first use only
        "scalelong.runlog.records",  # write_text_atomic, the one atomic text write
        "scalelong.runlog.lock",  # ... whose module says its warnings through the lock's warn_user
    }


# ----------------------------------------------------------------------------- the two layers

# The two layers are folders. The application: the trainer, its config and run folders
# (training/), the studies (studies/) and the command line (cli/). The library: everything else,
# what a user's own training loop imports; it imports torch, safetensors and itself, never the
# application, so a new module's layer is fixed by where it is put.
APPLICATION_FOLDERS = ("scalelong.training", "scalelong.studies", "scalelong.cli")


def in_application(module: str) -> bool:
    return any(module == folder or module.startswith(folder + ".") for folder in APPLICATION_FOLDERS)


def library_modules(graph: dict[str, set[str]]) -> set[str]:
    return {m for m in graph if m != ROOT and not in_application(m)}


# What `from scalelong import <the library's names>` loads in a fresh interpreter, exactly.
LIBRARY_NAMES = (
    "apply_scalelong, find_skips, Diagnostics, RunLog, SkipInput, describe, save_scalelong, load_scalelong"
)
LIBRARY_CLOSURE = {
    "scalelong",
    "scalelong.errors",
    "scalelong.skips",
    "scalelong.models",
    "scalelong.models.uvit",
    "scalelong.models.unet",
    "scalelong.adapters",
    "scalelong.adapters.declared",
    "scalelong.adapters.diffusers",
    "scalelong.adapters.uvit_diffusers",
    "scalelong.adapters.ddpm_pytorch",
    "scalelong.adapters.uvit_checkpoint",
    "scalelong.adapters.saving",
    "scalelong.adapters.declaration",
    "scalelong.adapters.tracing",
    "scalelong.adapters.checking",
    "scalelong.diagnostics",
    "scalelong.diagnostics.monitor",
    "scalelong.diagnostics.blocks",
    "scalelong.diagnostics.headroom",
    "scalelong.diagnostics.lipschitz",
    "scalelong.diagnostics.overflow",
    "scalelong.diagnostics.metric_names",
    "scalelong.diffusion",
    "scalelong.runlog",
    "scalelong.runlog.folder",
    "scalelong.runlog.records",
    "scalelong.runlog.lock",
    "scalelong.runlog.tracking",
}


def loaded_after(statement: str) -> tuple[set[str], set[str]]:
    """(scalelong modules, other top-level modules) in sys.modules after ``statement``, run in a
    fresh interpreter (it inherits PYTHONPATH, so the source under test is the one imported)."""
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, f"{statement!r} failed: {proc.stderr.strip().splitlines()[-1:]}"
    modules = set(json.loads(proc.stdout.splitlines()[-1]))
    ours = {m for m in modules if m == ROOT or m.startswith(ROOT + ".")}
    return ours, {m.split(".")[0] for m in modules - ours}


def test_the_library_imports_nothing_of_the_application_even_lazily():
    graph = import_graph()
    library = library_modules(graph)
    assert {"scalelong.skips", "scalelong.data", "scalelong.training.train", "scalelong.cli"} <= set(graph)
    assert "scalelong.data" in library and "scalelong.training.config" not in library
    leaks = {m: sorted(filter(in_application, graph[m])) for m in library}
    leaks = {m: imports for m, imports in leaks.items() if imports}
    assert not leaks, f"library modules import outside the library: {leaks}"


def test_the_library_names_load_exactly_the_library_in_a_fresh_interpreter():
    ours, others = loaded_after(f"from scalelong import {LIBRARY_NAMES}")
    assert ours == LIBRARY_CLOSURE, (
        f"unexpected: {sorted(ours - LIBRARY_CLOSURE)}, missing: {sorted(LIBRARY_CLOSURE - ours)}"
    )
    assert not any(map(in_application, ours))
    assert not {"yaml", "diffusers", "accelerate", "scipy", "matplotlib"} & others


def test_a_plain_loop_borrows_the_schedule_and_ema_cheaply():
    ours, _ = loaded_after("from scalelong.optim import ema_update, lr_factor")
    assert ours == {"scalelong", "scalelong.optim"}
    ours, _ = loaded_after(
        "from scalelong.training.train import ema_update, lr_factor"
    )  # the trainer's names too
    assert "scalelong.optim" in ours


def test_import_scalelong_loads_nothing_and_lists_every_lazy_name():
    ours, others = loaded_after("import scalelong")
    assert ours == {"scalelong"} and not {"torch", "yaml"} & others
    public = set(scalelong.__all__)
    assert public == set(scalelong._LAZY) and public <= set(dir(scalelong))
    # every lazy name is imported under `if TYPE_CHECKING:` too, so type checkers see it
    tree = ast.parse((SOURCE / "__init__.py").read_text())
    checked = next(
        n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING"
    )
    seen = {
        (node.module, a.name) for node in checked.body if isinstance(node, ast.ImportFrom) for a in node.names
    }
    assert seen == {(module, name) for name, module in scalelong._LAZY.items()}
    for name in public:
        assert getattr(scalelong, name) is getattr(__import__(scalelong._LAZY[name], fromlist=[name]), name)


def test_the_command_lines_help_and_config_listing_import_no_torch():
    """`scalelong --help`, `scalelong configs` and loading a config's text answer at once: building
    the parser and importing the config module load neither torch nor the trainer."""
    ours, others = loaded_after(
        "import contextlib, io\nfrom scalelong.cli import build_parser, main\n"
        "import scalelong.training.config\n"
        "build_parser()\nwith contextlib.redirect_stdout(io.StringIO()): main(['configs'])"
    )
    assert "torch" not in others and "scalelong.training.train" not in ours, sorted(ours)
    assert "scalelong.training.config" in ours and "scalelong.training.presets" in ours


# ----------------------------------------------------------------------------- moved modules


def test_every_moved_module_imports_under_its_old_path_with_one_warning():
    """Each module of 0.1 that moved still imports by its old path, as the new module itself, with
    one DeprecationWarning naming the new path at the line that imports it, and only once (fresh
    interpreter)."""
    code = (
        "import importlib, json, sys, warnings\n"
        "from scalelong import MOVED\n"
        "out = {}\n"
        "for old, new in MOVED.items():\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        user_code = compile(f'import {old}', 'user_code.py', 'exec')  # a user's import line\n"
        "        exec(user_code)\n"
        "        exec(user_code)\n"
        "        same = sys.modules[old] is importlib.import_module(new)\n"
        "    said = [f'{w.filename}: {w.message}' for w in caught if w.category is DeprecationWarning]\n"
        "    out[old] = [same, said]\n"
        "print(json.dumps(out))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert len(result) == 32
    for old, (same, messages) in result.items():
        new = scalelong.MOVED[old]
        assert same, old
        # said at the importing line (user_code.py), not inside importlib, scalelong or their caller
        assert messages == [
            f"user_code.py: {old} moved to {new}; the old path will be removed in scalelong 0.3"
        ], old
    assert not set(scalelong.MOVED.values()) - set(import_graph()), "a forwarding target that does not exist"


def test_the_top_level_reads_in_one_glance():
    """The package's top level: the library's modules and packages and the application's three
    folders, at most 17 entries (package data aside)."""
    entries = {
        p.name
        for p in SOURCE.iterdir()
        if p.name not in {"__pycache__", "assets", "configs"} and (p.suffix == ".py" or p.is_dir())
    }
    assert len(entries) <= 17, sorted(entries)
    assert {"training", "studies", "cli"} <= entries
