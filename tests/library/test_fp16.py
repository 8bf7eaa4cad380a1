"""fp16 on the CPU as a GPU computes it: CUDA's autocast policy (scalelong.fp16) and the trainer's use
of it (loss scaling, checkpoints, resume, refusals).

The reference is torch's own fp16 computation: ``torch.autocast("cpu", dtype=float16)`` on a model
where the CPU's lists and CUDA's agree (linear), with CUDA's fp32 ops (layer_norm, softmax) cast to
fp32 by hand, since the CPU's policy runs them in their input's dtype.
"""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn
from torch.overrides import TorchFunctionMode

from conftest import assert_bitwise_equal, tiny_cpu_config, tiny_uvit_overrides
from scalelong import fp16
from scalelong.cli import main
from scalelong.errors import ScaleLongError
from scalelong.fp16 import autocast_forward, disabled, gpu_autocast, gpu_fp16_autocast
from scalelong.training.checkpoint import check_resume_precision
from scalelong.training.config import load_config
from scalelong.training.train import train


class Tiny(nn.Module):
    """linear -> gelu -> layer_norm -> linear -> softmax; ``by_hand``: CUDA's fp32 ops cast to fp32
    explicitly (for torch's CPU autocast, which leaves them in their input's dtype)."""

    def __init__(self, by_hand: bool = False):
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(16, 64), nn.LayerNorm(64), nn.Linear(64, 32)
        self.by_hand = by_hand

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        up = (lambda t: t.float()) if self.by_hand else (lambda t: t)
        out = {"fc1": self.fc1(x)}
        out["gelu"] = F.gelu(out["fc1"])
        out["norm"] = self.norm(up(out["gelu"]))
        out["fc2"] = self.fc2(out["norm"])
        out["softmax"] = up(out["fc2"]).softmax(dim=-1)
        return out


def both(x: torch.Tensor, gain: float = 1.0, dtype: torch.dtype = torch.float16):
    """(ours, reference): the same weights (fc1's times ``gain``), under gpu_autocast(dtype) and under
    torch's autocast to ``dtype``."""
    torch.manual_seed(0)
    ours, ref = Tiny(), Tiny(by_hand=True)
    with torch.no_grad():
        ours.fc1.weight.mul_(gain)
    ref.load_state_dict(ours.state_dict())
    with gpu_autocast(dtype):
        a = ours(x)
    with torch.autocast("cpu", dtype=dtype):
        b = ref(x)
    return (ours, a), (ref, b)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float() - b.detach().float()).norm() / b.detach().float().norm())


# (dtype, bound on forward, on gradients), relative. fp16: measured 1e-6 to 3e-5 (softmax left in fp16:
# 2e-4) and <= 1.3e-4. bf16: 0 on a CPU without bf16 units (torch's kernels there are fp32 products of
# bf16 values too), against 2.5e-3 to 4.4e-3 from the fp32 model: the bound tells bf16 from fp32.
BOUNDS = [(torch.float16, 1e-4, 1e-3), (torch.bfloat16, 1e-3, 1e-3)]


@pytest.mark.parametrize("dtype, forward_bound, grad_bound", BOUNDS)
def test_forward_and_backward_agree_with_torchs_own_kernels_under_cudas_lists(
    dtype, forward_bound, grad_bound
):
    x = torch.randn(64, 16) * 3
    (ours, a), (ref, b) = both(x, dtype=dtype)
    # the dtypes CUDA gives: linear low, gelu on low low, layer_norm and softmax fp32
    want = {"fc1": dtype, "gelu": dtype, "norm": torch.float32, "fc2": dtype}
    assert {k: v.dtype for k, v in a.items()} == {**want, "softmax": torch.float32}
    assert {k: v.dtype for k, v in b.items()} == {k: v.dtype for k, v in a.items()}
    for k in a:  # the same values up to the low precision's rounding
        assert rel(a[k], b[k]) < forward_bound, k
    target = torch.randn(64, 32)
    for out in (a, b):
        ((out["softmax"] - target.softmax(-1)).square().sum() + out["fc2"].float().square().mean()).backward()
    for (name, p), q in zip(ours.named_parameters(), ref.parameters(), strict=True):
        assert p.grad.dtype == torch.float32 and rel(p.grad, q.grad) < grad_bound, name


def test_an_overflow_is_inf_in_the_elements_where_a_gpu_has_it():
    lin = nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 1.0], [1.0, -1.0], [-1.0, -1.0]]))
    x = torch.tensor([[4e4, 4e4], [3e4, 3e4], [-4e4, 1e3]])  # every input is finite in fp16
    with gpu_fp16_autocast():
        y = lin(x)
    with torch.autocast("cpu", dtype=torch.float16):
        ref = lin(x)
    inf = torch.tensor([[True, False, True], [False, False, False], [False, False, False]])
    assert y.dtype == torch.float16 and torch.equal(y.isinf(), inf) and torch.equal(ref.isinf(), inf)
    assert torch.equal(y[~inf], ref[~inf]) and y[0, 0] == math.inf and y[0, 2] == -math.inf
    # a whole network fed past fp16's range: non-finite in the same elements, at every stage
    (_, a), (_, b) = both(torch.randn(64, 16) * 2e3, gain=30.0)  # inputs in range, fc1's outputs not all
    assert a["fc1"].isinf().any() and not a["fc1"].isinf().all()
    for k in a:
        assert torch.equal(a[k].isfinite(), b[k].isfinite()), k


def test_policy_classes():
    x, w, h = torch.randn(4, 8), torch.randn(6, 8), torch.randn(4, 6).half()
    img, y = torch.randn(1, 4, 8, 8), torch.randn(4, 6)
    i = torch.arange(4)
    with gpu_fp16_autocast():
        low = [x @ w.T, torch.matmul(x, w.T), torch.bmm(x[None], w.T[None]), torch.einsum("ij,kj->ik", x, w)]
        low += [F.conv2d(img, torch.randn(4, 4, 3, 3)), F.scaled_dot_product_attention(x, x, x)]
        assert all(t.dtype == torch.float16 for t in low)
        fp32 = [h.softmax(-1), F.log_softmax(h, -1), F.layer_norm(h, (6,)), F.group_norm(img.half(), 2)]
        fp32 += [h.exp(), h.pow(2), h**2, h.square(), 1 / h, h.sum(), F.mse_loss(h, h), h.norm()]
        fp32 += [F.interpolate(img.half(), scale_factor=2.0), F.normalize(h, dim=-1), torch.cat([h, y])]
        assert all(t.dtype == torch.float32 for t in fp32)
        assert h.softmax(-1, dtype=torch.float16).dtype == torch.float16  # a given dtype is kept
        assert torch.dot(h[0], y[0]).dtype == torch.float32  # promote (torch alone refuses mixed dtypes)
        # on no list: fp16 stays fp16; fp16 with fp32 follows torch's promotion; integers untouched
        area = F.interpolate(img.half(), scale_factor=0.5, mode="area")  # adaptive_avg_pool: no list
        given = [F.gelu(h), F.silu(h), h.mean(), h + 1, area]
        assert all(t.dtype == torch.float16 for t in given)
        assert (h + y).dtype == torch.float32 and torch.where(h > 0, h, y).dtype == torch.float32
        assert i.sum().dtype == torch.int64 and (i @ i).dtype == torch.int64
        with torch.autocast("cuda", enabled=False):  # what turns it off on a GPU turns it off here
            assert (x @ w.T).dtype == torch.float32
        with disabled():
            assert F.linear(x, w).dtype == torch.float32 and h.softmax(-1).dtype == torch.float16
        assert F.linear(x, w).dtype == torch.float16
    assert not torch.is_autocast_enabled("cuda")
    out = autocast_forward(nn.Linear(8, 6))(x)  # Accelerate's prepared forward: fp32 outputs
    assert out.dtype == torch.float32


class Seen(TorchFunctionMode):
    """The torch functions a forward calls (entered inside gpu_fp16_autocast: it sees them first)."""

    def __init__(self):
        super().__init__()
        self.names: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.add(getattr(func, "__name__", ""))
        return func(*args, **(kwargs or {}))


# What the backbones call that is on none of CUDA's lists (runs as given on a GPU too).
UNLISTED = set(
    "__get__ __getitem__ add add_ arange cat clamp cos dim div double dropout flatten float gelu mean mul "
    "neg permute reshape silu sin split sqrt sub to transpose unbind unflatten unsqueeze view pad".split()
)


UNET = ["model.type=unet", "model.unet.in_channels=1"]


@pytest.mark.parametrize("overrides", [[], UNET], ids=["uvit", "unet"])
def test_the_backbones_call_only_classified_functions(overrides):
    from scalelong.training.build import build_model

    cfg = load_config("stability", overrides)
    model = build_model(cfg.model).eval()  # no dropout: the two forwards below compare
    x, t = torch.randn(2, 1, 32, 32), torch.rand(2)
    with gpu_fp16_autocast(), Seen() as seen:
        out = model(x, t)
    classified = {getattr(f, "__name__", "") for f in fp16._TABLE}
    assert seen.names - classified <= UNLISTED, sorted(seen.names - classified - UNLISTED)
    assert {"linear", "conv2d", "scaled_dot_product_attention", "cat"} <= seen.names
    assert ({"layer_norm", "einsum"} if not overrides else {"group_norm", "interpolate"}) <= seen.names
    assert out.dtype == torch.float16 and out.isfinite().all()
    assert rel(out, model(x, t)) < 2e-2  # fp16 rounding, not another network


# ----------------------------------------------------------------------------- the trainer


def tiny(tmp_path, name: str, *extra: str):
    return tiny_cpu_config(tmp_path, name, "diagnostics.noise_levels=0", *extra)


def final(run, step: int = 8) -> dict:
    ckpt = run / "checkpoints" / f"step-{step:06d}"
    return {
        "model": load_file(ckpt / "model.safetensors"),
        "ema": load_file(ckpt / "ema.safetensors"),
        "optimizer": torch.load(ckpt / "optimizer.pt", weights_only=True),
        "trainer": torch.load(ckpt / "trainer.pt", weights_only=True),
    }


def test_fp16_on_the_cpu_trains_with_loss_scaling_and_resumes_bitwise(tmp_path):
    straight = train(tiny(tmp_path, "straight", "train.mixed_precision=fp16"), progress=False).run_dir
    records = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["loss"]) for r in records) and all("loss_scale" in r for r in records)
    trainer = torch.load(straight / "checkpoints" / "step-000008" / "trainer.pt", weights_only=True)
    assert trainer["precision"] == "fp16" and trainer["scaler"]["scale"] == records[-1]["loss_scale"]
    summary = json.loads((straight / "summary.json").read_text())
    assert summary["provenance"]["precision"] == "fp16"
    # the scaler's skips are counted as such (the first steps overflow at the initial scale 65,536)
    assert summary["overflow_steps"] == sum(r["overflow_steps"] for r in records) > 0
    assert summary["nonfinite_steps"] == 0 and trainer["scaler"]["scale"] < 65536
    # stopped after 4 steps, then resumed to 8: the run of 8 bit for bit
    train(tiny(tmp_path, "resumed", "train.mixed_precision=fp16", "train.steps=4"), progress=False)
    resumed = train(tiny(tmp_path, "resumed", "train.mixed_precision=fp16"), progress=False).run_dir
    assert_bitwise_equal(final(straight), final(resumed))


def test_a_resume_in_another_precision_is_refused(tmp_path, monkeypatch, capsys):
    import scalelong.training.launch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(scalelong.training.launch, "cpu_has_bf16", lambda: True)  # auto is bf16 here
    args = [f"{o}" for o in tiny_uvit_overrides("moved", tmp_path) if "steps" not in o and "mixed" not in o]
    args += ["train.mixed_precision=auto", "train.checkpoint_every=2", "sample.num_images=0"]
    args += ["diagnostics.noise_levels=0", "train.batch_size=8", "train.tensorboard=false"]
    assert main(["train", "demo_uvit", "--no-progress", *args, "train.steps=2"]) == 0
    monkeypatch.setattr(scalelong.training.launch, "cpu_has_bf16", lambda: False)  # where auto is fp32
    capsys.readouterr()
    assert main(["train", "demo_uvit", "--no-progress", *args, "train.steps=4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "written by a run in bf16 and this run computes in fp32" in err


def test_check_resume_precision():
    path = "runs/x/checkpoints/step-000004"
    check_resume_precision({"precision": "fp16", "scaler": {"scale": 1.0}}, "fp16", path)
    check_resume_precision({"scaler": None}, "fp32", path)  # a checkpoint from before the field
    with pytest.raises(ScaleLongError, match="written by a run in fp16 and this run computes in fp32"):
        check_resume_precision({"scaler": {"scale": 1.0}}, "fp32", path)
    with pytest.raises(ScaleLongError, match="holds no loss-scaler state"):
        check_resume_precision({"scaler": None}, "fp16", path)


def test_fp16_sampling_on_the_cpu_runs_the_forward_under_the_policy(monkeypatch):
    import scalelong.training.evaluation
    from scalelong.training.build import build_model
    from scalelong.training.evaluation import forward_precision, sample_features

    cfg = load_config("configs/demo_uvit.yaml", tiny_uvit_overrides("s", "/nonexistent", 1))
    model = build_model(cfg.model).eval()
    flat = lambda images: images.flatten(1)  # noqa: E731  the pixels as features
    plain = sample_features(model, cfg, flat, range(4), "dpm_solver", 5, 4, "cpu")
    cfg.eval.mixed_precision = "fp16"
    assert forward_precision(cfg, "cpu") == "fp16"
    made = []  # the policy's contexts the sampler entered

    def counted(dtype):
        made.append(fp16.gpu_autocast(dtype))
        return made[-1]

    monkeypatch.setattr(scalelong.training.evaluation, "gpu_autocast", counted)
    low = sample_features(model, cfg, flat, range(4), "dpm_solver", 5, 4, "cpu")
    assert made and {m.dtype for m in made} == {torch.float16} and low.dtype == torch.float32
    rel = ((low - plain).norm() / plain.norm()).item()
    assert 0 < rel < 0.05, rel
