import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import tiny_uvit_overrides
from scalelong.training.build import build_model
from scalelong.training.config import load_config
from scalelong.training.runs import RunDir
from scalelong.training.train import train


def test_30_steps_lower_the_loss(tmp_path):
    cfg = load_config("configs/demo_uvit.yaml", tiny_uvit_overrides("fall", tmp_path, steps=30))
    result = train(cfg, progress=False)
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 6
    # epsilon-MSE starts near 1 (the network predicts ~0); it must fall clearly within 30 steps
    assert losses[0] > 0.75
    assert losses[-1] < 0.85 * losses[0]
    assert (result.run_dir / "config.yaml").is_file()
    assert (
        "debug" not in (result.run_dir / "config.yaml").read_text()
    )  # test hooks are passed in, not configured
    assert result.samples is not None and result.samples.is_file()


def test_same_config_gives_identical_weights(tmp_path):
    weights = []
    for name in ("a", "b"):
        cfg = load_config("configs/demo_uvit.yaml", tiny_uvit_overrides(name, tmp_path, steps=8, method="ls"))
        result = train(cfg, progress=False)
        weights.append(load_file(result.checkpoint / "model.safetensors"))
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    # and the run really trained: every tensor of the LS gate moved away from its initialisation
    # (the seed's model), by no more than 8 AdamW steps at lr <= 5e-3 can move it
    torch.manual_seed(cfg.train.seed)
    init = build_model(cfg.model).state_dict()
    gates = [k for k in weights[0] if k.startswith("skip_scaling.")]
    assert len(gates) == 4  # two Linear layers, weight and bias
    for k in gates:
        moved = (weights[0][k] - init[k]).abs().max().item()
        assert 0 < moved < 0.05, (k, moved)


def test_trainer_logs_diagnostics_with_the_index_convention(tmp_path):
    overrides = tiny_uvit_overrides("diag", tmp_path, steps=10, method="cs")
    overrides += ["model.uvit.depth=4", "model.skip.kappa=0.5", "diagnostics.every=5"]
    result = train(load_config("configs/demo_uvit.yaml", overrides), progress=False)
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    diag = [r for r in records if "feature_norm" in r]
    assert [r["step"] for r in diag] == [5, 10]
    for r in diag:
        skips = sorted({int(k.split("/")[1]) for k in r if k.startswith("skip/")})
        assert skips == [1, 2]
        assert r["skip/1/coef_mean"] == 1.0 and r["skip/2/coef_mean"] == 0.5
        assert r["nonfinite_total"] == 0  # the trainer's count of skipped steps is not overwritten


def test_diagnostics_off_logs_no_skip_statistics(tmp_path):
    overrides = tiny_uvit_overrides("nodiag", tmp_path, steps=5) + ["diagnostics.every=0"]
    result = train(load_config("configs/demo_uvit.yaml", overrides), progress=False)
    text = (result.run_dir / "metrics.jsonl").read_text()
    assert "skip/" not in text and "feature_norm" not in text


def test_the_summary_records_what_made_the_run(tmp_path):
    """Provenance: a study can tell per run which code, torch, precision and machine made it; the
    precision is the one that ran (``auto`` is fp32 on a CPU without bf16 units), and whose autocast
    computed it (bf16 on such a CPU: CUDA's policy, computed by scalelong.fp16)."""
    from scalelong.runlog.provenance import source_commit
    from scalelong.training.launch import cpu_has_bf16

    overrides = tiny_uvit_overrides("prov", tmp_path, steps=2) + ["train.mixed_precision=bf16"]
    result = train(load_config("configs/demo_uvit.yaml", overrides), progress=False)
    made = json.loads((result.run_dir / "summary.json").read_text())["provenance"]
    assert made["torch"] == torch.__version__ and made["device"] == "cpu"
    assert made["precision"] == "bf16"
    assert made["autocast"] == ("torch" if cpu_has_bf16() else "cuda policy on cpu")
    overrides = tiny_uvit_overrides("auto", tmp_path, steps=1) + ["train.mixed_precision=auto"]
    result = train(load_config("configs/demo_uvit.yaml", overrides), progress=False)
    auto = json.loads((result.run_dir / "summary.json").read_text())["provenance"]
    assert (auto["precision"], auto["autocast"]) == (("bf16", "torch") if cpu_has_bf16() else ("fp32", None))
    assert made["commit"] == source_commit() and len(made["commit"].split("+")[0]) == 40
    assert made["device_name"] and made["threads"] == torch.get_num_threads()


def test_evaluation_during_training_and_final_rescore_of_the_best_step(tmp_path):
    overrides = tiny_uvit_overrides("eval", tmp_path, steps=10) + [
        "eval.every=5",
        "eval.num_samples=20",
        "eval.steps=3",
        "eval.batch_size=10",
        "eval.final_num_samples=30",
        "train.checkpoint_every=5",
    ]
    result = train(load_config("configs/demo_uvit.yaml", overrides), progress=False)
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    fds = {r["step"]: r["fd"] for r in records if "fd" in r}
    assert sorted(fds) == [5, 10] and all(v > 0 for v in fds.values())
    summary = json.loads((result.run_dir / "summary.json").read_text())
    best = summary["best"]
    assert best["best_step"] == min(fds, key=fds.get)
    assert best["fd_samples"] == 30 and best["fd_at_eval"] == fds[best["best_step"]]


def test_grad_accum_4_micro_batches_of_8_equal_one_batch_of_32_through_resume(tmp_path, capsys):
    """train.grad_accum changes how a step's batch is run, not the step: losses, gradient norms,
    diagnostics and weights equal those of the whole batch at once, across a resume too."""
    base = tiny_uvit_overrides("x", tmp_path, steps=6, method="ls") + [
        "data.hflip=true",
        "train.batch_size=32",
        "train.log_every=1",
        "train.checkpoint_every=3",
        "diagnostics.every=3",
        "diagnostics.noise_levels=0",  # measured at each run's last step: step 3 of the first leg
        "sample.num_images=0",
    ]

    def run(name: str, *extra: str):
        return train(load_config("configs/demo_uvit.yaml", [*base, f"name={name}", *extra]), progress=False)

    def records(result) -> dict[int, dict]:
        return {r["step"]: r for r in RunDir(result.run_dir).metrics()}  # non-finite values as floats

    one = run("one")
    run("accum", "train.grad_accum=4", "train.steps=3")
    capsys.readouterr()
    accum = run("accum", "train.grad_accum=4")  # resumes from step 3
    assert "resuming" in capsys.readouterr().out
    a, b = records(one), records(accum)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5, 6]
    for step in a:
        keys = [k for k in a[step] if k != "img_per_s"]
        assert sorted(keys) == sorted(k for k in b[step] if k != "img_per_s")
        for k in keys:  # the oscillation windows after the resume included
            if isinstance(a[step][k], str):  # fp16/least_op: a module's name
                assert b[step][k] == a[step][k], (step, k)
                continue
            assert b[step][k] == pytest.approx(a[step][k], rel=1e-4, abs=1e-6, nan_ok=True), (step, k)
    assert "skip/1/coef_mean" in a[3] and "block_grad_norm" in a[6]  # the diagnostics are compared
    for weights in ("model.safetensors", "ema.safetensors"):
        x, y = load_file(one.checkpoint / weights), load_file(accum.checkpoint / weights)
        for k in x:
            torch.testing.assert_close(y[k], x[k], rtol=1e-4, atol=1e-5, msg=k)

    # the number of micro-batches may change when a run resumes: it is not part of the step
    capsys.readouterr()
    more = run("accum", "train.grad_accum=2", "train.steps=7")
    assert "resuming" in capsys.readouterr().out
    straight = run("one", "train.steps=7")
    assert records(more)[7]["loss"] == pytest.approx(records(straight)[7]["loss"], rel=1e-4)


def test_a_run_is_evaluated_at_its_last_step_too():
    from scalelong.training.evaluation import TrainingEvaluator

    cfg = load_config("configs/demo_uvit.yaml", ["train.steps=1950", "eval.every=1300"])
    evaluator = TrainingEvaluator.__new__(TrainingEvaluator)  # due() reads the config only
    evaluator.cfg, evaluator.e = cfg, cfg.eval
    assert [s for s in range(1, 1951) if evaluator.due(s)] == [1300, 1950]
    cfg.eval.every = 0
    assert not any(evaluator.due(s) for s in (1300, 1950))
