"""Fast paths give the plain path's numbers: channels_last UNet, the compiled trainer.

No timing here; speed is measured in benchmarks/fast_paths.py.
"""

import functools
import json

import pytest
import torch

from conftest import tiny_uvit_overrides
from scalelong.errors import ScaleLongError
from scalelong.models import UNet
from scalelong.training.config import load_config
from scalelong.training.train import train


def test_channels_last_unet_matches_contiguous():
    model = UNet(16, 1, 16, (1, 2), 2, (8,), dropout=0.0, norm_groups=8, skip_method="cs", kappa=0.7).eval()
    x, t = torch.randn(2, 1, 16, 16), torch.rand(2) * 999
    with torch.no_grad():
        plain = model(x, t)
        fast = model.to(memory_format=torch.channels_last)(x.contiguous(memory_format=torch.channels_last), t)
    torch.testing.assert_close(fast, plain, rtol=1e-4, atol=1e-5)


def test_compiled_training_matches_eager_and_keeps_diagnostics(tmp_path, monkeypatch):
    # The eager backend traces through dynamo (guards, graph breaks, hooks) without the C++ compile.
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    runs = {}
    for name, compiled in (("eager", "false"), ("compiled", "true")):
        overrides = tiny_uvit_overrides(name, tmp_path, steps=6, method="ls")
        overrides += [f"train.compile={compiled}", "diagnostics.every=3", "sample.num_images=0"]
        result = train(load_config("configs/demo_uvit.yaml", overrides), progress=False)
        runs[name] = [
            json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()
        ]
    for a, b in zip(runs["eager"], runs["compiled"], strict=True):
        assert a["step"] == b["step"] and a.keys() == b.keys()
        if "loss" in a:
            assert abs(a["loss"] - b["loss"]) <= 1e-4 * abs(a["loss"])
    diag = [r for r in runs["compiled"] if "skip/1/coef_mean" in r]
    assert [r["step"] for r in diag] == [3, 6]  # diagnostic steps run eager: the probe still fires


class _InductorFailure(RuntimeError):
    """Stands for what inductor raises on a machine without a C++ compiler."""


_InductorFailure.__module__ = "torch._inductor.exc"


def _losses(run_dir) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_failing_compile_falls_back_to_eager_with_one_line(tmp_path, monkeypatch, capsys):
    def broken(model, *args, **kwargs):
        def forward(*a, **k):
            raise _InductorFailure("InductorError: CppCompileError: C++ compile error (no g++)")

        return forward

    eager = train(
        load_config("configs/demo_uvit.yaml", tiny_uvit_overrides("eager", tmp_path, 6)), progress=False
    )
    monkeypatch.setattr(torch, "compile", broken)
    cfg = load_config(
        "configs/demo_uvit.yaml", tiny_uvit_overrides("broken", tmp_path, 6) + ["train.compile=true"]
    )
    result = train(cfg, progress=False)
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: train.compile: torch.compile failed (InductorError: CppCompileError: C++ compile error "
        "(no g++)); training eager"
    ]
    assert _losses(result.run_dir) == _losses(eager.run_dir)  # the failed step itself reran eager


def test_an_error_of_the_model_under_compile_is_not_swallowed(tmp_path, monkeypatch):
    def raising(model, *args, **kwargs):
        def forward(*a, **k):
            raise ValueError("a bug in the model")

        return forward

    monkeypatch.setattr(torch, "compile", raising)
    cfg = load_config(
        "configs/demo_uvit.yaml", tiny_uvit_overrides("bug", tmp_path, 3) + ["train.compile=true"]
    )
    try:
        train(cfg, progress=False)
    except ValueError as e:
        assert str(e) == "a bug in the model"
    else:
        raise AssertionError("the model's own error was swallowed")


def test_adamw_kernels_give_the_same_update():
    from scalelong.training.config import OptimConfig
    from scalelong.training.train import make_optimizer

    results = {}
    for kernel in ("default", "foreach", "fused"):
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 4)
        opt = make_optimizer(
            model.parameters(), OptimConfig(lr=1e-2, implementation=kernel), torch.device("cpu")
        )
        assert bool(opt.defaults.get("fused")) == (kernel == "fused")
        assert bool(opt.defaults.get("foreach")) == (kernel == "foreach")
        for _ in range(3):
            model(torch.ones(2, 8)).square().sum().backward()
            opt.step()
            opt.zero_grad()
        results[kernel] = model.weight.detach().clone()
    torch.testing.assert_close(results["fused"], results["default"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(results["foreach"], results["default"], rtol=1e-6, atol=1e-7)
    assert not torch.equal(results["default"], torch.nn.Linear(8, 4).weight)  # it trained


def test_an_unavailable_fused_adamw_falls_back_with_one_line(monkeypatch, capsys):
    from scalelong.training.config import OptimConfig
    from scalelong.training.train import make_optimizer

    real = torch.optim.AdamW

    def no_fused(params, **kwargs):
        if kwargs.get("fused"):
            raise RuntimeError(
                "`fused=True` requires all the params to be floating point Tensors of supported devices"
            )
        return real(params, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", no_fused)
    opt = make_optimizer(
        torch.nn.Linear(2, 2).parameters(), OptimConfig(implementation="fused"), torch.device("cpu")
    )
    assert isinstance(opt, real) and not opt.defaults.get("fused")
    assert capsys.readouterr().out.splitlines() == [
        "warning: optim.implementation=fused is not available on cpu (`fused=True` requires all the params "
        "to be floating point Tensors of supported devices); using torch's default AdamW"
    ]


def test_bf16_on_a_cpu_without_bf16_units_is_computed_as_a_gpu_does_and_auto_is_fp32(monkeypatch, capsys):
    from scalelong.training import launch

    monkeypatch.setattr(launch, "cpu_has_bf16", lambda: False)
    captured = {}
    monkeypatch.setattr("accelerate.Accelerator", lambda **kw: captured.update(kw) or kw)
    cfg = load_config("configs/demo_uvit.yaml", ["train.device=cpu", "train.mixed_precision=bf16"])
    launch.make_accelerator(cfg)  # the trainer computes CUDA's bf16 policy itself: an fp32 Accelerator
    assert captured["mixed_precision"] == "no" and not capsys.readouterr().out
    assert launch.gpu_autocast_dtype("bf16", "cpu") == torch.bfloat16
    cfg.train.compile = True
    with pytest.raises(ScaleLongError, match="mixed_precision=bf16 on a CPU without bf16 units"):
        launch.make_accelerator(cfg)
    cfg.train.compile, cfg.train.mixed_precision = False, "auto"  # auto: bf16 only where it is fast
    launch.make_accelerator(cfg)
    assert captured["mixed_precision"] == "no" and launch.resolve_precision("auto", "cpu") == "no"
    monkeypatch.setattr(launch, "cpu_has_bf16", lambda: True)
    launch.make_accelerator(cfg)
    assert captured["mixed_precision"] == "bf16" and launch.gpu_autocast_dtype("bf16", "cpu") is None
    cfg.train.mixed_precision = "bf16"
    launch.make_accelerator(cfg)
    assert captured["mixed_precision"] == "bf16"


def test_bf16_sampling_scores_close_to_fp32(monkeypatch):
    from scalelong.training import launch
    from scalelong.training.build import build_model
    from scalelong.training.evaluation import sample_features

    monkeypatch.setattr(launch, "cpu_has_bf16", lambda: True)  # the bf16 numerics, on any CPU
    cfg = load_config("configs/demo_uvit.yaml", tiny_uvit_overrides("s", "/nonexistent", 1))
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    flat = lambda images: images.flatten(1)  # noqa: E731  the pixels as features
    plain = sample_features(model, cfg, flat, range(4), "dpm_solver", 5, 4, "cpu")
    cfg.eval.mixed_precision = "bf16"
    low = sample_features(model, cfg, flat, range(4), "dpm_solver", 5, 4, "cpu")
    assert low.dtype == torch.float32
    rel = ((low - plain).norm() / plain.norm()).item()
    assert 0 < rel < 0.05, rel


def test_bf16_sampling_on_a_cpu_without_bf16_units_runs_cudas_policy_and_auto_runs_fp32(
    tmp_path, monkeypatch, capsys
):
    # torch's own bf16 kernels ran the demo's evaluations ~10x slower than fp32 on an AVX2-only CPU
    import scalelong.training.evaluation
    from scalelong import fp16
    from scalelong.training import launch
    from scalelong.training.build import build_model
    from scalelong.training.evaluation import TrainingEvaluator, sample_features

    monkeypatch.setattr(launch, "cpu_has_bf16", lambda: False)
    overrides = tiny_uvit_overrides("s", tmp_path, 1) + ["eval.every=1", "eval.num_samples=4", "eval.steps=2"]
    cfg = load_config("configs/demo_uvit.yaml", [*overrides, "eval.mixed_precision=bf16"])
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    flat = lambda images: images.flatten(1)  # noqa: E731  the pixels as features
    made = []  # the policies the sampler entered

    def counted(dtype):
        made.append(fp16.gpu_autocast(dtype))
        return made[-1]

    monkeypatch.setattr(scalelong.training.evaluation, "gpu_autocast", counted)
    low = sample_features(model, cfg, flat, range(2), "dpm_solver", 2, 2, "cpu")
    assert made and {m.dtype for m in made} == {torch.bfloat16}
    cfg.eval.mixed_precision = "no"
    plain = sample_features(model, cfg, flat, range(2), "dpm_solver", 2, 2, "cpu")
    assert 0 < ((low - plain).norm() / plain.norm()).item() < 0.05
    cfg.eval.mixed_precision = "auto"  # auto: fp32 where bf16 is not fast
    assert torch.equal(plain, sample_features(model, cfg, flat, range(2), "dpm_solver", 2, 2, "cpu"))
    for asked, ran in (("bf16", "bf16"), ("auto", "fp32")):
        cfg.eval.mixed_precision = asked
        assert TrainingEvaluator(cfg, tmp_path / "run", "cpu")(1, model)["fd_precision"] == ran
    assert not capsys.readouterr().out
    monkeypatch.setattr(launch, "cpu_has_bf16", lambda: True)
    assert TrainingEvaluator(cfg, tmp_path / "run", "cpu")(1, model)["fd_precision"] == "bf16"


def test_bf16_trains_in_bf16_on_a_cpu_without_bf16_units(tmp_path, monkeypatch):
    """The forward runs under CUDA's bf16 policy: its loss departs from fp32's by bf16's rounding."""
    from scalelong.training import launch

    monkeypatch.setattr(launch, "cpu_has_bf16", lambda: False)
    losses = {}
    for p in ("no", "bf16", "auto"):
        overrides = [*tiny_uvit_overrides(f"p-{p}", tmp_path, 5), f"train.mixed_precision={p}"]
        result = train(load_config("configs/demo_uvit.yaml", overrides), progress=False)
        records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
        losses[p] = [r["loss"] for r in records if "loss" in r]
    assert losses["auto"] == losses["no"]  # auto: fp32 where bf16 is not fast
    assert losses["bf16"] != losses["no"]
    assert max(abs(b / f - 1) for b, f in zip(losses["bf16"], losses["no"], strict=True)) < 0.02


def test_the_start_line_says_what_the_run_computes_in(tmp_path, monkeypatch, capsys):
    from scalelong.training import launch

    monkeypatch.setattr(launch, "cpu_has_bf16", lambda: False)
    for p, said in (("bf16", "bf16 (CUDA's autocast policy)"), ("auto", "fp32")):
        overrides = [*tiny_uvit_overrides(f"say-{p}", tmp_path, 1), f"train.mixed_precision={p}"]
        train(load_config("configs/demo_uvit.yaml", overrides), progress=False)
        first = capsys.readouterr().out.splitlines()[0]
        assert first.startswith("scalelong: ") and f"1 process(es) on cpu in {said}, run: " in first, first
