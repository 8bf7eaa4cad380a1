import os
from pathlib import Path

# One thread for torch, OpenMP and BLAS, here and in every subprocess a test starts: the models
# are tiny, and on a shared machine spinning worker threads cost more than they bring.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

# The tests sit in folders that mirror src/scalelong; this folder holds what they share (this
# module, the *_fixtures modules, the scripts run by path) and is on sys.path for all of them.
TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


@pytest.fixture(autouse=True)
def _seed_and_threads():
    # Every test starts from one thread: a benchmark's main() run in-process sets its own count, and a
    # later test comparing numbers across processes (tests/studies/test_cluster.py) must not inherit it.
    torch.manual_seed(0)
    torch.set_num_threads(1)
    yield


# The demo preset trains in bf16 on two CPU processes; the tests run its network in fp32 in this
# process, where exact comparisons (resume, micro-batches, two processes against one) hold to 1e-5.
# tests/training/test_train_fast_paths.py and tests/models/test_uvit_bf16.py test the bf16 path
# itself.
FP32_ONE_PROCESS = ["train.mixed_precision=no", "train.cpu_processes=1"]


# A U-ViT of 2 blocks, width 16, with LS gates: a model whose checkpoints are a few KB.
TINY_UVIT = [
    "model.uvit.patch_size=8",
    "model.uvit.embed_dim=16",
    "model.uvit.depth=2",
    "model.uvit.num_heads=2",
    "model.skip.method=ls",
]


def tiny_uvit_overrides(name: str, out_dir, steps: int = 30, method: str = "none") -> list[str]:
    """Overrides that turn configs/demo_uvit.yaml into a tiny, fast run (its end-of-run noise-level probe
    on 16 held-out images: on the default 256 the probe costs more than the 30 steps)."""
    return [
        f"name={name}",
        f"out_dir={out_dir}",
        f"model.skip.method={method}",
        "model.uvit.embed_dim=32",
        "model.uvit.depth=2",
        "model.uvit.num_heads=2",
        "model.uvit.patch_size=8",
        f"train.steps={steps}",
        "train.batch_size=16",
        "train.log_every=5",
        "optim.lr=5e-3",
        "optim.warmup_steps=5",
        "sample.num_images=4",
        "sample.steps=5",
        "eval.every=0",
        "diagnostics.every=0",
        "diagnostics.noise_levels=16",  # the end-of-run probe on 16 held-out images, not the default 256
        *FP32_ONE_PROCESS,
    ]


def learning_uvit_overrides(out_dir, name: str = "t") -> list[str]:
    """Overrides that turn configs/demo_uvit.yaml into a tiny U-ViT (depth 4, patch 4) whose loss falls
    clearly within its 40 steps, with diagnostics every 4 steps (the noise-level probe at the end on
    16 held-out images) and 3 non-finite steps in a row ending a run: small studies of runs that
    learn, or diverge."""
    return [
        f"out_dir={out_dir}",
        f"name={name}",
        "model.uvit.depth=4",
        "model.uvit.embed_dim=16",
        "model.uvit.num_heads=2",
        "model.uvit.patch_size=4",
        "train.steps=40",
        "train.batch_size=16",
        "train.log_every=4",
        "train.checkpoint_every=0",
        "train.max_nonfinite_steps=3",
        "train.tensorboard=false",
        "train.device=cpu",
        "optim.lr=2e-2",
        "optim.warmup_steps=2",
        "diagnostics.every=4",
        "diagnostics.noise_levels=16",  # the end-of-run probe on 16 held-out images, not the default 256
        "eval.every=0",
        "sample.num_images=0",
        *FP32_ONE_PROCESS,
    ]


def nan_loss_at(*steps: int):
    """A loss hook (``train(..., loss_hooks=[...])``): a NaN loss, so NaN gradients, at these steps."""

    def hook(step: int, loss: torch.Tensor) -> torch.Tensor:
        return loss * float("nan") if step in steps else loss

    return hook


def tiny_cpu_config(tmp_path, name: str, *extra: str):
    """The demo config of an 8-step tiny U-ViT run on the CPU (checkpoints every 4 steps, no samples),
    with ``extra`` overrides: the trainer tests' common run."""
    from scalelong.training.config import load_config

    overrides = tiny_uvit_overrides(name, tmp_path, steps=8) + [
        "train.batch_size=8",
        "train.log_every=2",
        "train.checkpoint_every=4",
        "train.device=cpu",
        "train.tensorboard=false",
        "sample.num_images=0",
        *extra,
    ]
    return load_config("configs/demo_uvit.yaml", overrides)


def run_cli(capsys, *args) -> tuple[int, str, str]:
    """``scalelong ARGS`` in this process (each argument as ``str``): its exit code, stdout and
    stderr, read off ``capsys``."""
    from scalelong.cli import main

    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def run_cli_on_cpu(capsys, *args) -> tuple[int, str, str]:
    """:func:`run_cli` with ``--no-progress --device cpu`` after ARGS: the commands that draw from a
    run (``sample``, ``eval``) as the tests run them."""
    return run_cli(capsys, *args, "--no-progress", "--device", "cpu")


def assert_bitwise_equal(a, b, where: str = "") -> None:
    """Two states (tensors, or dicts, lists and tuples of them) equal bit for bit: the resume tests'
    check; ``where`` names the entry that differs."""
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_bitwise_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_bitwise_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where
