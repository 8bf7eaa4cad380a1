"""Stability knobs: the non-finite policy, mixed precision, gradient clipping, the lr schedule."""

import functools
import json
import math

import pytest
import torch
from safetensors.torch import load_file

import scalelong.training.train
from conftest import nan_loss_at, tiny_cpu_config, tiny_uvit_overrides
from scalelong.cli import main
from scalelong.errors import ScaleLongError
from scalelong.training.checkpoint import list_checkpoints, nonfinite_tensors
from scalelong.training.train import lr_factor, train


def tiny(tmp_path, name: str, *extra: str):
    return tiny_cpu_config(tmp_path, name, *extra)


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_one_nan_step_is_skipped_counted_and_never_saved(tmp_path):
    result = train(tiny(tmp_path, "nan3"), progress=False, loss_hooks=[nan_loss_at(3)])
    logged = records(result.run_dir)
    assert [r["nonfinite_steps"] for r in logged] == [0, 1, 0, 0]  # step 3 is in the window of step 4
    assert logged[-1]["nonfinite_total"] == 1
    assert all(math.isfinite(r["loss"]) for r in logged)
    assert json.loads((result.run_dir / "summary.json").read_text())["nonfinite_steps"] == 1
    for ckpt in list_checkpoints(result.run_dir / "checkpoints"):
        saved = {
            "model": load_file(ckpt / "model.safetensors"),
            "ema": load_file(ckpt / "ema.safetensors"),
            "optimizer": torch.load(ckpt / "optimizer.pt", weights_only=True),
        }
        assert nonfinite_tensors(saved) == []
        # the skipped step made no update: Adam counted 3 of the first 4 steps
        if ckpt.name == "step-000004":
            assert float(next(iter(saved["optimizer"]["state"].values()))["step"]) == 3


def test_nan_at_every_step_stops_after_k_with_exit_2(tmp_path, capsys, monkeypatch):
    # `scalelong train` calls scalelong.training.train.train: give it a NaN loss at every step
    nan_train = functools.partial(scalelong.training.train.train, loss_hooks=[nan_loss_at(*range(1, 9))])
    monkeypatch.setattr(scalelong.training.train, "train", nan_train)
    cfg_args = [f"{o}" for o in tiny_uvit_overrides("allnan", tmp_path, steps=8)]
    code = main(
        [
            "train",
            "configs/demo_uvit.yaml",
            *cfg_args,
            "--no-progress",
            "train.device=cpu",
            "train.tensorboard=false",
        ]
        + ["sample.num_images=0", "train.max_nonfinite_steps=3"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "stopped at step 3" in err and "3 steps in a row" in err
    logged = records(tmp_path / "allnan")
    assert logged[-1]["step"] == 3 and logged[-1]["nonfinite_total"] == 3
    assert "loss" not in logged[-1]  # no finite step to average: absent, not zero
    assert list_checkpoints(tmp_path / "allnan" / "checkpoints") == []
    summary = json.loads((tmp_path / "allnan" / "summary.json").read_text())  # every ending writes one
    assert summary["status"] == "stopped" and summary["steps"] == 3 and summary["nonfinite_steps"] == 3
    assert "stopped at step 3" in summary["error"] and math.isnan(summary["final_loss"])
    assert not (tmp_path / "allnan" / ".lock").exists()
    # studies count it as a result; the forward was finite, so the loss hook is what went non-finite
    assert summary["stopped"] == {
        "step": 3,
        "kind": "nonfinite",
        "cause": "non-finite loss with a finite forward of every fp16 op (step 3)",
    }


def test_bf16_on_cpu_trains_and_compiled_fp16_on_cpu_is_a_clear_error(tmp_path):
    # epsilon-prediction: its loss starts near 1 (the input-free loss), so 1.2 bounds a run that trains
    result = train(
        tiny(tmp_path, "bf16", "train.mixed_precision=bf16", "diffusion.prediction=eps"), progress=False
    )
    losses = [r["loss"] for r in records(result.run_dir)]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < 1.2
    assert all(v.dtype == torch.float32 for v in load_file(result.checkpoint / "model.safetensors").values())
    # fp16 on the CPU trains (tests/library/test_fp16.py), but not compiled: inductor would not round to fp16
    with pytest.raises(ScaleLongError, match="train.compile=true with train.mixed_precision=fp16 on the CPU"):
        train(tiny(tmp_path, "fp16", "train.mixed_precision=fp16", "train.compile=true"), progress=False)
    assert not (tmp_path / "fp16").exists()


def test_the_last_skipped_step_survives_a_resume(tmp_path):
    """A step skipped before the run was interrupted is still the summary's ``last_skipped`` after it
    resumes and ends: the cause is restored with the checkpoint, not lost with the process."""
    train(tiny(tmp_path, "nan3", "train.steps=4"), progress=False, loss_hooks=[nan_loss_at(3)])
    before = json.loads((tmp_path / "nan3" / "summary.json").read_text())["last_skipped"]
    assert before == "non-finite loss with a finite forward of every fp16 op (step 3)"
    train(tiny(tmp_path, "nan3"), progress=False)  # resumes from step 4, no skipped step after it
    summary = json.loads((tmp_path / "nan3" / "summary.json").read_text())
    assert summary["steps"] == 8 and summary["nonfinite_steps"] == 1
    assert summary["last_skipped"] == before


def blow_up_skip_merge(at: int, value: float):
    """A step hook: after step ``at`` the first out-block's skip merge gets weights of ``value``, so
    its output passes fp16's 65,504 (or turns non-finite) while every earlier op stays as it was."""

    def hook(step, trainer):
        if step == at:
            with torch.no_grad():
                trainer.unwrapped.out_blocks[0].skip_linear.weight.fill_(value)

    return hook


@pytest.mark.parametrize("precision", ["fp16", "no"])
def test_a_run_stopped_by_an_overflow_names_the_module_step_and_value(tmp_path, precision):
    """fp16 on the CPU: the merge's output past 65,504 is inf, the run stops and its summary says
    where (the module, the step, its largest value on the logged steps before). In fp32 the same
    weights of 1e4 stay finite; weights of inf are a non-finite output fp32 shows too."""
    value = 1e4 if precision == "fp16" else math.inf
    extra = ["train.max_nonfinite_steps=2", "diagnostics.every=2"]
    cfg = tiny(tmp_path, f"run-{precision}", f"train.mixed_precision={precision}", *extra)
    with pytest.raises(scalelong.training.train.TrainingStopped) as stop:
        train(cfg, progress=False, step_hooks=[blow_up_skip_merge(4, value)])  # after step 4's checkpoint
    summary = json.loads((tmp_path / f"run-{precision}" / "summary.json").read_text())
    cause = summary["stopped"]["cause"]
    where = "fp16 overflow" if precision == "fp16" else "non-finite output, as fp32 would show too,"
    assert cause.startswith(f"{where} in forward at out_blocks.0.skip_linear (step 6: |value| ")
    assert "on the logged steps before)" in cause  # diagnostics every 2 steps: steps 2 and 4 seen
    assert stop.value.cause == cause and f"the last: {cause}" in str(stop.value)
    # what to try, by the cause: the merge's overflow fits in bf16, and a norm after each merge bounds it
    assert ("model.skip.method=merge-norm" in str(stop.value)) == (precision == "fp16")
    assert ("train.mixed_precision=no" in str(stop.value)) == (precision == "no")
    from scalelong.studies.divergence import cause as cause_of
    from scalelong.studies.divergence import divergence

    (found,) = divergence([], stopped=summary["stopped"])
    assert cause_of(found) == f"nonfinite: {where} in forward at out_blocks.0.skip_linear"


def test_grad_clip_bounds_the_update(tmp_path):
    moved = {}
    for clip in (0.0, 1e-9):
        cfg = tiny(
            tmp_path, f"clip{clip}", f"train.grad_clip={clip}", "train.steps=4", "optim.warmup_steps=0"
        )
        result = train(cfg, progress=False)
        torch.manual_seed(cfg.train.seed)
        from scalelong.training.build import build_model

        init = build_model(cfg.model).state_dict()
        final = load_file(result.checkpoint / "model.safetensors")
        moved[clip] = sum((final[k] - init[k]).abs().sum().item() for k in final)
        assert records(result.run_dir)[-1]["grad_norm"] > 1e-3  # the logged norm is before clipping
    # Adam is scale-free except for eps: gradients of norm 1e-9 sit far below eps=1e-8
    assert moved[1e-9] < 0.05 * moved[0.0]


def test_lr_schedules():
    warm = [lr_factor(s, 4, 20, "constant", 0.0) for s in range(8)]
    assert warm == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0]
    cos = [lr_factor(s, 4, 20, "cosine", 0.1) for s in (3, 4, 12, 20, 25)]
    assert cos[0] == 1.0 and cos[1] == pytest.approx(1.0)
    assert (
        cos[2] == pytest.approx(0.1 + 0.9 * 0.5)
        and cos[3] == pytest.approx(0.1)
        and cos[4] == pytest.approx(0.1)
    )


def test_metric_hooks_merge_into_the_log(tmp_path):
    def every_third(step, trainer):
        return {"probe": float(step), "ema_decay": trainer.cfg.train.ema_decay} if step % 3 == 0 else {}

    result = train(
        tiny(tmp_path, "hooks", "train.checkpoint_every=0"), progress=False, metric_hooks=[every_third]
    )
    logged = {r["step"]: r for r in records(result.run_dir)}
    assert sorted(logged) == [2, 3, 4, 6, 8]
    assert logged[3] == {"step": 3, "probe": 3.0, "ema_decay": 0.995}  # between log steps: the extras only
    assert logged[6]["probe"] == 6.0 and "loss" in logged[6]
    assert "probe" not in logged[4]


def test_training_on_drops_the_earlier_summary_until_the_run_ends(tmp_path):
    cfg = tiny(tmp_path, "longer", "train.steps=4", "train.checkpoint_every=0")
    train(cfg, progress=False)
    assert json.loads((tmp_path / "longer" / "summary.json").read_text())["steps"] == 4
    seen = []
    cfg.train.steps = 6  # resumes from step 4: the old summary no longer describes the run
    train(cfg, progress=False, step_hooks=[lambda step, tr: seen.append(tr.run.summary_file.exists())])
    assert seen == [False, False]
    summary = json.loads((tmp_path / "longer" / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["status"] == "complete"
