import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield


def tiny_uvit_overrides(name: str, out_dir, steps: int = 30, method: str = "none") -> list[str]:
    """Overrides that turn configs/demo.yaml into a tiny, fast run."""
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
    ]
