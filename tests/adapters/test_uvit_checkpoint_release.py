"""Our UViT + load_uvit_checkpoint against outputs of the released model code.

tests/fixtures/uvit_release_reference.safetensors was made once by running the release's own
model classes (nothing of them is in this repository); tests/fixtures/README.md lists the steps.
It holds, per case, a state dict under the release's key names (``<case>/state/<key>``) and
the release's float32 output for each ScaleLong mode evaluated with it
(``<case>/out/<scalelong>``), plus the shared inputs (``inputs/x``, ``t``, ``y``, ``context``).
The file's metadata gives each case's constructor arguments as JSON and the source commits.

Cases (img 16, patch 2, D 8, 2 heads, depth 4 unless noted; weights drawn at O(1) scale so
that a wrong token order or gate order shows far above the tolerance):

- ``uncond``: unconditional, modes 0 (none), 1 (sqrt2), 2 (cs, kappa 0.5) on one state dict
- ``cond``: class-conditional (10 classes), modes 0, 1, 2
- ``cond_ls``: class-conditional, mode 3 (shared LS gate ``se.layer{1,2}``)
- ``cond_ls_nonshare``: class-conditional, depth 6, mode 4 (``se.{0,1,2}.layer{1,2}``)
- ``uncond_ls_nonshare``: unconditional, mode 4
- ``cond_mlp_time``: class-conditional, ``mlp_time_embed=True``, mode 2
- ``t2i``: text-conditional (baofff/U-ViT libs/uvit_t2i.py), 5 context tokens of width 8
"""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from conftest import TESTS
from scalelong.adapters import load_uvit_checkpoint

FIXTURE = TESTS / "fixtures" / "uvit_release_reference.safetensors"
METHODS = {0: "none", 1: "sqrt2", 2: "cs", 3: "ls", 4: "ls-nonshare"}  # the release's scalelong=0..4


def _cases() -> dict[str, dict]:
    with safe_open(FIXTURE, "pt") as f:
        meta = f.metadata()
    return {name: json.loads(v) for name, v in sorted(meta.items()) if name != "source"}


CASES = _cases()


def our_kwargs(release: dict, mode: int) -> dict:
    """The release's constructor arguments in our UViT's terms."""
    ours = {
        "img_size": release["img_size"],
        "patch_size": release["patch_size"],
        "in_channels": release["in_chans"],
        "embed_dim": release["embed_dim"],
        "depth": release["depth"],
        "num_heads": release["num_heads"],
        "mlp_ratio": release["mlp_ratio"],
        "qkv_bias": release["qkv_bias"],
        "mlp_time_embed": release.get("mlp_time_embed", False),
        "skip_method": METHODS[mode],
        "kappa": 0.5,
    }
    if "clip_dim" in release:  # libs/uvit_t2i.py
        ours |= {"context_dim": release["clip_dim"], "context_tokens": release["num_clip_token"]}
    else:
        ours["num_classes"] = max(release["num_classes"], 0)  # the release writes -1 for none
    return ours


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    return load_file(FIXTURE)


def test_fixture_is_small_and_complete(reference):
    assert FIXTURE.stat().st_size <= 1_000_000
    assert all(v.dtype in (torch.float32, torch.int64) for v in reference.values())
    covered = {(name, mode) for name, case in CASES.items() for mode in case["modes"]}
    assert {mode for _, mode in covered} == set(METHODS)
    assert {"cond_ls", "cond_ls_nonshare", "cond_mlp_time", "t2i"} <= set(CASES)


@pytest.mark.parametrize(
    "name, mode", [(name, mode) for name, case in CASES.items() for mode in case["modes"]]
)
def test_reproduces_the_release(name, mode, reference, tmp_path):
    state = {k.split("/", 2)[2]: v for k, v in reference.items() if k.startswith(f"{name}/state/")}
    save_file(state, tmp_path / "nnet.safetensors")  # the release's own key names
    kwargs = our_kwargs(CASES[name]["kwargs"], mode)
    model = load_uvit_checkpoint(tmp_path / "nnet.safetensors", kwargs).eval()

    x, t = reference["inputs/x"], reference["inputs/t"]
    cond = {}
    if kwargs.get("num_classes", 0) > 0:
        cond["y"] = reference["inputs/y"]
    if kwargs.get("context_dim", 0) > 0:
        cond["context"] = reference["inputs/context"]
    with torch.no_grad():
        out = model(x, t, **cond)
    expected = reference[f"{name}/out/{mode}"]
    assert out.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)
