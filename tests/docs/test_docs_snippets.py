"""Every code block of README.md and docs/ runs, or at least parses and validates.

The rules, so a page can say what it likes as long as it stays true:

* Pages: README.md and docs/*.md (the guide), each one test per kind of block; docs/results/
  (study records) only have their ``scalelong`` commands validated, since they take hours.
* ```python blocks run in order, the blocks of one page sharing one namespace, in a temporary
  working directory that holds a link to the repository's ``configs/``. Blocks whose lines start
  with ``>>>`` run as doctests in the same namespace. Sockets are closed and the Hugging Face
  libraries are offline while they run: a snippet may not download anything (show a local
  folder written by an earlier block instead of ``from_pretrained("hub-id")``).
* ```bash blocks: every line (``\\`` continuations joined, comments dropped, ``&&`` split,
  leading ``NAME=value`` environment assignments dropped) is one command, and every command
  needs a rule here, or the test fails:

  - ``scalelong info`` and ``scalelong configs`` run.
  - ``scalelong train`` runs with ``--dry-run`` when its data are on this machine (the embedded
    digits, or a ``data.path`` that exists), else it is validated.
  - ``scalelong compare`` and ``scalelong sweep``: with ``--dry-run`` where the command
    has it, else validated: arguments parsed by the CLI's own parser, the config loaded with
    its overrides, the methods, learning rates and depths parsed, and every run's config built
    and validated as the study would before its first run. Nothing is trained, nothing is
    submitted. The commands of docs/cluster.md run as on a machine with 8 GPUs
    (``scalelong.training.launch.visible_gpus`` faked), so ``--jobs 8`` is placed rather than refused.
  - ``sbatch ... --wrap "CMD"``: CMD is checked by these same rules.
  - ``scalelong sample``, ``analyze`` and ``eval`` (slow) run against a tiny run made once per
    module, in place of the run folder the page names, with ``--out`` in a temporary folder and
    ``--n`` at most 16 (a command that is then the same as one already run runs once);
    those that need what this machine lacks (FID's Inception weights and reference statistics,
    text-to-image encoders) are validated.
  - ``scalelong fid-stats`` and ``extract-features`` (datasets and encoders not on this machine)
    are validated.
  - ``make TARGET``: the Makefile has the target (``make demo`` takes minutes, ``make test`` and
    ``make test-all`` are this suite). ``pip install``: every extra named exists in pyproject.toml, and pinned
    torch / torchvision versions are a pair the Makefile installs. ``python -m MODULE``: the
    module can be imported (benchmarks and checks take minutes). ``mkdocs``: tests/docs/test_docs_build.py.
  - Validated means: parsed by ``scalelong.cli``'s parser exactly as ``scalelong`` would, and the
    config, if the command takes one, loaded and validated with its overrides.

* Every model a test checks (``scalelong.training.build.check_model``: built, and one input passed through
  it) is checked once per test: the commands of a page check the same few models again and again.
* A page that holds the line ``<!-- docs-test: run at toy size: OVERRIDES -->`` (OVERRIDES may
  be empty) runs instead every ``scalelong`` command it shows, in order, in one temporary
  working directory: first every block with a ``title="file"`` is written to that file, and a
  config's missing ``data.path`` of a folder or an array becomes a few random images of the
  model's input shape; then each command runs with :data:`TOY_RUN` and the page's OVERRIDES
  appended, ``--seeds`` 1, the first two of ``--lrs``, and ``--jobs`` / ``--num-processes`` 1.
"""

from __future__ import annotations

import doctest
import importlib.util
import re
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO, run_cli, tiny_uvit_overrides

ROOT = REPO
GUIDE = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RECORDS = sorted((ROOT / "docs" / "results").glob("**/*.md"))
SKIPPED_WORDS = {"cd", ".", "source"}  # shell plumbing around a command, nothing to check


@dataclass
class Block:
    lang: str
    code: str
    line: int  # line of the first code line in the page, 1-based
    title: str = ""  # the fence's title="..." (a file the page shows)

    def where(self, page: Path) -> str:
        return f"{page.relative_to(ROOT)}:{self.line}"


def fenced_blocks(text: str) -> list[Block]:
    """The fenced code blocks of a markdown page (``` or ~~~, indented or not), in order."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        title = re.search(r'title="([^"]+)"', lines[i])
        body, j = [], i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        blocks.append(Block(lang.lower(), "\n".join(body) + "\n", i + 2, title.group(1) if title else ""))
        i = j + 1
    return blocks


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def blocks_of(page: Path, langs: tuple[str, ...]) -> list[Block]:
    return [b for b in fenced_blocks(page.read_text()) if b.lang in langs]


# ----------------------------------------------------------------------------- python blocks


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """A temporary working directory with ``configs/``, no network, Hugging Face offline."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(var, "1")

    def refuse(*args, **kwargs):
        raise RuntimeError("a documentation snippet tried to use the network; use a local path")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    (tmp_path / "configs").symlink_to(ROOT / "configs", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_python_block(block: Block, page: Path, namespace: dict) -> None:
    if block.code.lstrip().startswith(">>>"):
        test = doctest.DocTestParser().get_doctest(block.code, namespace, block.where(page), str(page), 0)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        runner.run(test, clear_globs=False)
        assert runner.failures == 0, f"doctest at {block.where(page)} failed (output above)"
        return
    # Padding keeps the page's line numbers in a traceback.
    code = compile("\n" * (block.line - 1) + block.code, str(page), "exec")
    exec(code, namespace)


PYTHON_PAGES = [p for p in GUIDE if blocks_of(p, ("python", "py", "pycon"))]


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=page_id)
def test_python_snippets_run(page: Path, offline):
    namespace: dict = {"__name__": "__docs__"}
    blocks = blocks_of(page, ("python", "py", "pycon"))
    for block in blocks:
        run_python_block(block, page, namespace)
    # Even a model in the local Hugging Face cache must come from a folder an earlier block wrote.
    for block in blocks:
        for name in re.findall(r"from_pretrained\(\s*[\"']([^\"']+)[\"']", block.code):
            assert (offline / name).exists(), f"{block.where(page)}: from_pretrained({name!r}): no folder"


# ----------------------------------------------------------------------------- shell blocks


def commands(code: str) -> list[list[str]]:
    """The commands of a shell block: continuations joined, comments dropped, ``&&`` split."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):  # CUDA_VISIBLE_DEVICES=0 cmd
            words = words[1:]
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            out.append(words[:cut])
            words = words[cut + 1 :]
    return [c for c in out if c]


def cli_parse(argv: list[str]):
    """``argv`` parsed exactly as ``scalelong.cli.main`` parses it (overrides anywhere)."""
    from scalelong.cli import build_parser

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    unknown = [a for a in extra if a.startswith("-") or not hasattr(args, "overrides")]
    assert not unknown, f"unrecognized arguments: {unknown}"
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def has_option(command: str, option: str) -> bool:
    from scalelong.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return option in sub.choices[command]._option_string_actions


def load(args):
    from scalelong.training.config import load_config

    overrides = list(args.overrides)
    if getattr(args, "steps", None) and args.command == "compare":
        overrides.append(f"train.steps={args.steps}")
    return load_config(args.config, overrides)


def validate_study(args) -> int:
    """Every run config of a compare / sweep, built and validated; nothing is trained."""
    from scalelong.studies.compare import method_config
    from scalelong.studies.running import parse_methods
    from scalelong.studies.sweep import parse_numbers, plan
    from scalelong.training.config import validate

    cfg = load(args)
    methods = parse_methods(args.methods)
    if args.command == "compare":
        runs = [
            method_config(cfg, m, cfg.train.seed + k, Path("runs"))
            for k in range(args.seeds)
            for m in methods
        ]
    else:
        lrs = parse_numbers(args.lrs, "--lrs")
        depths = parse_numbers(args.depths, "--depths", int) if args.depths else None
        runs = plan(cfg, methods, lrs, depths, args.seeds, Path("runs"))
    for run in runs:
        validate(run)
    return len(runs)


def data_here(cfg) -> bool:
    return cfg.data.name == "mnist" or (cfg.data.path is not None and Path(cfg.data.path).exists())


def needs_what_is_missing(args) -> bool:
    """FID (Inception weights, reference statistics) or text-to-image encoders."""
    if args.command == "sample":
        return bool(args.prompt or args.prompts_file)
    if args.command == "eval":
        return bool(args.fid_stats or args.inception_weights or args.metric == "fid")
    return False


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([\w.-]+)\s*:(?!=)", text, re.M)}


def makefile_torch_pairs() -> set[tuple[str, str]]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"torch==([\w.+]+) torchvision==([\w.+]+)", text))


def pyproject_extras() -> set[str]:
    """The names of ``[project.optional-dependencies]`` (Python 3.10 has no tomllib)."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([A-Za-z][\w-]*)\s*=", section, re.M))


def check_pip(words: list[str], where: str) -> None:
    """``pip install`` of the package: its extras exist; pinned torch / torchvision: the Makefile's pair."""
    extras = pyproject_extras()
    pins = {}
    for word in words[2:]:
        if word.startswith("."):  # ., .[a,b]
            named = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", word)
            assert named, f"{where}: cannot read the package argument {word!r}"
            for extra in (named.group(1) or "").split(","):
                assert not extra or extra in extras, (
                    f"{where}: no extra {extra!r}; pyproject.toml has {sorted(extras)}"
                )
        elif "==" in word:
            name, version = word.split("==", 1)
            pins[name] = version
    if pins:
        pair = (pins.get("torch"), pins.get("torchvision"))
        assert pair in makefile_torch_pairs(), (
            f"{where}: pins {pins}; the Makefile installs {makefile_torch_pairs()}"
        )


def check_non_cli(words: list[str], where: str) -> None:
    head = words[0]
    if head in SKIPPED_WORDS or head == "mkdocs":
        return
    if head == "make":
        missing = set(words[1:]) - makefile_targets()
        assert not missing, f"{where}: the Makefile has no target {sorted(missing)}"
    elif head in ("pip", "pip3") and words[1:2] == ["install"]:
        check_pip(words, where)
    elif head.startswith("python") and words[1:2] == ["-m"]:
        if words[2] == "pip":
            check_pip(words[2:], where)
        else:
            assert importlib.util.find_spec(words[2]) is not None, f"{where}: no module {words[2]}"
    else:
        pytest.fail(
            f"{where}: no rule for the command {shlex.join(words)!r}; add one to {Path(__file__).name}"
        )


@pytest.fixture
def each_model_checked_once(monkeypatch):
    """``scalelong.training.build.check_model`` remembered by model config for one test. Every command of a
    study page checks every model of its runs, and the commands share them (docs/studies.md: 100
    checks of 28 models, most of the page's time); the check is a function of the config alone
    (the model built and run on one input, the RNG state given back), so a second one of the same
    config can only repeat the first. The command line looks the function up when it runs."""
    import scalelong.training.build

    check, checked = scalelong.training.build.check_model, {}

    def once(cfg):
        key = repr(
            cfg
        )  # as scalelong.training.build.check_models tells configs apart: every field spelled out
        if key not in checked:
            checked[key] = check(cfg)
        return checked[key]

    monkeypatch.setattr(scalelong.training.build, "check_model", once)


# The kinds of scalelong command, by what the test does with them.
RUN_HERE = {"info", "configs"}
ON_A_RUN = {"sample", "analyze", "eval"}
STUDIES = {"compare", "sweep"}
VALIDATED = {"fid-stats", "extract-features"}


def cli_commands(pages: list[Path], kinds: set[str] | None = None) -> list[tuple[str, list[str]]]:
    found = []
    for page in pages:
        for block in blocks_of(page, ("bash", "sh", "shell", "console")):
            for words in commands(block.code):
                if words[0] == "scalelong" and (kinds is None or words[1] in kinds):
                    found.append((block.where(page), words[1:]))
    return found


def run_cli_text(argv: list[str], capsys) -> tuple[int, str]:
    """``scalelong ARGV`` in this process: its exit code, and its stdout and stderr as one text."""
    code, out, err = run_cli(capsys, *argv)
    return code, out + err


def check_command(
    argv: list[str],
    where: str,
    capsys,
    run_dir: Path | None = None,
    out: Path | None = None,
    ran: list[list[str]] | None = None,
) -> None:
    """Check one ``scalelong`` command by its kind (the rules above); ``ran``: the commands on a run
    folder already run, as they ran (a second, identical one would only do the same again)."""
    command = argv[0]
    args = cli_parse(argv)
    if command in RUN_HERE:
        code, text = run_cli_text(argv, capsys)
        assert code == 0, f"{where}: scalelong {shlex.join(argv)}\n{text}"
    elif command == "train":
        cfg = load(args)
        if data_here(cfg):
            code, text = run_cli_text([*argv, "--dry-run"] if not args.dry_run else argv, capsys)
            assert code == 0, f"{where}: scalelong {shlex.join(argv)} --dry-run\n{text}"
    elif command in STUDIES:
        if has_option(command, "--dry-run"):
            code, text = run_cli_text([*argv, "--dry-run"], capsys)
            assert code == 0, f"{where}: scalelong {shlex.join(argv)} --dry-run\n{text}"
        else:
            assert validate_study(args) > 0
    elif command in ON_A_RUN:
        if needs_what_is_missing(args) or run_dir is None:
            return
        swapped = fewer_images([str(run_dir) if a == args.run_dir else a for a in argv])
        if "--out" in swapped:
            swapped[swapped.index("--out") + 1] = str(out)
        if ran is not None:
            if swapped in ran:
                return
            ran.append(swapped)
        code, text = run_cli_text([*swapped, "--no-progress"] if command != "analyze" else swapped, capsys)
        assert code == 0, f"{where}: scalelong {shlex.join(swapped)}\n{text}"
        if command == "sample":
            n = cli_parse(swapped).n
            assert len(list(out.rglob("*.png"))) == n, f"{where}: not {n} images in {out}"
    elif command in VALIDATED:
        if hasattr(args, "config"):
            load(args)
    else:
        pytest.fail(f"{where}: no rule for `scalelong {command}`; add one to {Path(__file__).name}")


FAST = RUN_HERE | {"train"} | STUDIES | VALIDATED

# Images a command on a run folder draws at most: what sample and eval do with a run does not
# depend on how many (the page's 1000 for FD-MNIST took most of the run-folder test's time).
MOST_IMAGES = 16


def fewer_images(argv: list[str]) -> list[str]:
    """``argv`` with its ``--n`` at most :data:`MOST_IMAGES`."""
    out = list(argv)
    if "--n" in out:
        k = out.index("--n") + 1
        out[k] = str(min(int(out[k]), MOST_IMAGES))
    return out


GPUS_OF_THE_PAGE = {"cluster.md": 8}  # pages that describe a machine with GPUs, and how many


def wrapped(words: list[str], where: str) -> list[list[str]]:
    """The commands of ``sbatch ... --wrap "CMD"``."""
    for k, word in enumerate(words):
        if word == "--wrap" and k + 1 < len(words):
            return commands(words[k + 1])
        if word.startswith("--wrap="):
            return commands(word.removeprefix("--wrap="))
    pytest.fail(f"{where}: sbatch without --wrap: nothing to check")


def check_shell_command(words: list[str], where: str, capsys, toy: bool = False) -> None:
    """Check one command of a page (``toy``: a page run at toy size elsewhere; here only parsed)."""
    if words[0] == "sbatch":
        for inner in wrapped(words, where):
            check_shell_command(inner, where, capsys, toy)
    elif words[0] != "scalelong":
        check_non_cli(words, where)
    elif toy:
        cli_parse(words[1:])
    elif words[1] in FAST:
        check_command(words[1:], where, capsys)
    else:
        assert words[1] in ON_A_RUN, f"{where}: no rule for `scalelong {words[1]}`"
        cli_parse(words[1:])


@pytest.mark.parametrize("page", [p for p in GUIDE if blocks_of(p, ("bash", "sh", "shell"))], ids=page_id)
def test_shell_commands_of_the_guide_parse_and_validate(
    page: Path, offline, capsys, monkeypatch, each_model_checked_once
):
    """Every command is known; the fast kinds (info, train --dry-run, ...) run here (a page that
    runs at toy size runs them in :func:`test_a_toy_size_page_runs_every_command`)."""
    if page.name in GPUS_OF_THE_PAGE:
        import scalelong.training.launch

        names = [str(i) for i in range(GPUS_OF_THE_PAGE[page.name])]
        monkeypatch.setattr(scalelong.training.launch, "visible_gpus", lambda: names)
    toy = toy_overrides(page) is not None
    for block in blocks_of(page, ("bash", "sh", "shell", "console")):
        for words in commands(block.code):
            check_shell_command(words, block.where(page), capsys, toy)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A finished run of a tiny U-ViT (4 steps), for the commands that act on a run folder."""
    from scalelong.cli import main

    out = tmp_path_factory.mktemp("docs-run")
    argv = ["train", str(ROOT / "configs" / "demo.yaml"), "--no-progress"]
    assert main([*argv, *tiny_uvit_overrides("tiny", out, steps=4), "train.checkpoint_every=2"]) == 0
    return out / "tiny"


@pytest.mark.slow
def test_run_folder_commands_run_on_a_tiny_run(tiny_run, offline, capsys):
    found = cli_commands(GUIDE, ON_A_RUN)
    assert any(argv[0] == "sample" for _, argv in found), "the guide shows no scalelong sample"
    ran: list[list[str]] = []
    for k, (where, argv) in enumerate(found):
        check_command(argv, where, capsys, run_dir=tiny_run, out=offline / f"out-{k}", ran=ran)


def test_recorded_study_commands_still_parse_and_validate():
    """The commands at the top of docs/results/ still mean what they meant (no run)."""
    found = cli_commands(RECORDS)
    assert found, "docs/results/ records no scalelong command"
    for where, argv in found:
        if any("$" in a for a in argv):  # a shell loop's variable: the loop is not a command
            continue
        args = cli_parse(argv)
        if hasattr(args, "config"):
            cfg = load(args)
            if argv[0] in STUDIES:
                assert validate_study(args) > 0, where
            assert cfg is not None


# ----------------------------------------------------------------------------- pages run at toy size

# What turns a page's study into a toy: a few steps of a small batch, on the CPU, nothing drawn.
TOY_RUN = [
    "train.steps=4",
    "train.batch_size=4",
    "train.log_every=2",
    "train.checkpoint_every=0",
    "train.tensorboard=false",
    "train.device=cpu",
    "optim.warmup_steps=1",
    "diagnostics.every=2",
    "diagnostics.noise_levels=4",
    "diagnostics.noise_levels_every=0",
    "eval.every=0",
    "sample.num_images=0",
]
TOY_MARK = re.compile(r"^<!-- docs-test: run at toy size:(.*)-->\s*$", re.M)


def toy_overrides(page: Path) -> list[str] | None:
    """The page's extra toy overrides, or None for a page that does not run at toy size."""
    m = TOY_MARK.search(page.read_text())
    return None if m is None else m.group(1).split()


def toy_argv(argv: list[str], extra: list[str]) -> list[str]:
    """``argv`` at toy size: one seed, two learning rates, one job and one process."""
    out, i = [], 0
    while i < len(argv):
        word = argv[i]
        if word in ("--seeds", "--jobs", "--num-processes") and i + 1 < len(argv):
            out += [word, "1"]
            i += 2
        elif word == "--lrs" and i + 1 < len(argv):
            out += [word, ",".join(argv[i + 1].split(",")[:2])]
            i += 2
        else:
            out.append(word)
            i += 1
    options = [w for w in out if w.startswith("-")]
    first = out.index(options[0]) if options else len(out)
    toy = [*out[:first], *TOY_RUN, *extra, *out[first:]]  # overrides before the options
    return toy + (["--no-progress"] if has_option(argv[0], "--no-progress") else [])


def make_toy_data(cfg) -> None:
    """A few random images of the model's input shape where the config's folder or array is missing."""
    import numpy as np
    from PIL import Image

    from scalelong.training.build import model_input_shape

    path = Path(cfg.data.path or "")
    if cfg.data.name not in ("folder", "array") or path.exists():
        return
    c, h, w = model_input_shape(cfg.model)
    pixels = np.random.default_rng(0).integers(0, 256, (16, h, w, c), dtype=np.uint8)
    if cfg.data.name == "array":
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, pixels)
        return
    path.mkdir(parents=True)
    for i, image in enumerate(pixels):
        Image.fromarray(image[..., 0] if c == 1 else image).save(path / f"{i:02d}.png")


TOY_PAGES = [p for p in GUIDE if toy_overrides(p) is not None]


@pytest.mark.slow
@pytest.mark.parametrize("page", TOY_PAGES, ids=page_id)
def test_a_toy_size_page_runs_every_command(page: Path, offline, capsys, each_model_checked_once):
    extra = toy_overrides(page)
    blocks = fenced_blocks(page.read_text())
    for block in blocks:
        if block.title:
            (offline / block.title).write_text(block.code)
    ran = 0
    for block in blocks:
        if block.lang not in ("bash", "sh", "shell"):
            continue
        for words in commands(block.code):
            where = block.where(page)
            if words[0] != "scalelong":
                check_non_cli(words, where)
                continue
            args = cli_parse(words[1:])
            cfg = load(args) if hasattr(args, "config") else None
            held = ["data.heldout=4"] if cfg is not None and cfg.data.name in ("folder", "array") else []
            argv = toy_argv(words[1:], [*held, *extra])
            if cfg is not None:
                make_toy_data(cfg)
            code, text = run_cli_text(argv, capsys)
            assert code == 0, f"{where}: scalelong {shlex.join(argv)}\n{text}"
            ran += 1
    assert ran, f"{page_id(page)} runs at toy size but shows no scalelong command"
