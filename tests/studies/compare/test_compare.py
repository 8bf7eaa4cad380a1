import json
import math
import statistics
from pathlib import Path

import pytest
import torch

import scalelong.studies.running
from conftest import learning_uvit_overrides, tiny_uvit_overrides
from scalelong.cli import main
from scalelong.errors import ScaleLongError
from scalelong.studies.compare import run_comparison, steps_to_target, summarise, summary_table
from scalelong.studies.divergence import (
    Divergence,
    DivergenceRule,
    cause,
    criteria,
    divergence,
    feature_growth,
    loss_collapse,
)
from scalelong.studies.running import check_run_dirs, parse_methods, plan_table, reusable, run_all, train_run
from scalelong.studies.statistics import mean_ci
from scalelong.studies.summary import StudyRun
from scalelong.training.config import load_config
from scalelong.training.launch import cpu_cores, share_cores
from scalelong.training.runs import RunDir
from scalelong.training.train import TrainingInterrupted, train


def fd_curve(steps_to_values):
    return [{"step": s, "fd": v, "loss": 1.0} for s, v in steps_to_values]


def study(runs):
    """``runs[method]``: the records of each seed, seed k at position k."""
    return {
        m: [StudyRun(f"{m}-seed{k}", r, {}, [], seed=k) for k, r in enumerate(rs)] for m, rs in runs.items()
    }


def fd_records(values, start=1000, every=1000):
    return [{"step": start + k * every, "fd": v} for k, v in enumerate(values)]


def test_steps_to_target_known_answer():
    runs = {
        "none": fd_records([100.0, 50.0, 30.0, 20.0]),  # final 20, first reached at 4000
        "cs": fd_records([80.0, 30.0, 20.0, 15.0]),  # reaches 20 at 3000
        "ls": fd_records([60.0, "nan", 19.0, 12.0]),  # the NaN at 2000 does not count; 19 at 3000
        "sqrt2": fd_records([90.0, 60.0, 40.0, 25.0]),  # never
        "fast": fd_records([18.0, 10.0]),  # at 1000
    }
    res = steps_to_target(runs, "none")
    assert res.target == 20.0
    assert res.steps == {"none": 4000, "cs": 3000, "ls": 3000, "sqrt2": None, "fast": 1000}
    assert res.speedup == {
        "none": 1.0,
        "cs": pytest.approx(4 / 3),
        "ls": pytest.approx(4 / 3),
        "sqrt2": None,
        "fast": 4.0,
    }


def test_steps_to_target_non_monotone_baseline_and_errors():
    runs = {"none": fd_records([100.0, 15.0, 30.0, 20.0]), "cs": fd_records([20.0, 10.0])}
    res = steps_to_target(runs, "none")
    assert res.steps["none"] == 2000  # it first got as good as its final value at step 2000
    assert res.speedup["cs"] == 2.0
    with pytest.raises(ScaleLongError, match="baseline"):
        steps_to_target(runs, "ls")
    with pytest.raises(ScaleLongError, match="finite"):
        steps_to_target({"none": fd_records(["nan"])}, "none")


def test_summary_pairs_the_change_and_the_speedup_by_seed_with_known_answer():
    runs = {
        # baseline reaches its final FD (10) at step 400 in both seeds
        "none": [
            fd_curve([(100, 40), (200, 20), (300, 12), (400, 10)]),
            fd_curve([(100, 50), (200, 30), (300, 15), (400, 10)]),
        ],
        # cs gets there at 200 in seed 0 and 300 in seed 1: speed-ups 2.0 and 1.333
        "cs": [
            fd_curve([(100, 30), (200, 9), (300, 8), (400, 7)]),
            fd_curve([(100, 35), (200, 14), (300, 10), (400, 9)]),
        ],
        # sqrt2 never reaches 10
        "sqrt2": [fd_curve([(100, 60), (200, 40), (300, 30), (400, 20)])] * 2,
    }
    by_method = {s.method: s for s in summarise(study(runs), "none")}
    none, cs = by_method["none"], by_method["cs"]
    assert none.steps_to_target == [400, 400]
    assert cs.steps_to_target == [200, 300]
    assert by_method["sqrt2"].steps_to_target == [None, None]
    # per seed 2.0 and 1.333: the geometric mean sqrt(8/3), exp(mean ± t(0.975, 1) sd / sqrt 2) of the logs
    speed = cs.speedup(none)
    logs = [math.log(2.0), math.log(4 / 3)]
    half = 12.706204736174707 * statistics.stdev(logs) / math.sqrt(2)
    assert speed.estimate == pytest.approx(math.sqrt(8 / 3))
    assert (speed.low, speed.high) == pytest.approx(
        (math.sqrt(8 / 3) * math.exp(-half), math.sqrt(8 / 3) * math.exp(half))
    )
    # final FD 7 and 9 against 10 and 10: the geometric mean of 0.7 and 0.9, -21%
    assert cs.fd_change(none).estimate == pytest.approx(math.sqrt(0.63))
    rows = {
        r.split("|")[1].strip(): [c.strip() for c in r.split("|")[1:-1]]
        for r in summary_table(list(by_method.values()), "none").splitlines()
    }
    assert (
        rows["method"][2] == "final FD vs none (95% CI)" and rows["method"][7] == "speed-up vs none (95% CI)"
    )
    assert rows["cs"][1].startswith("8 ± ") and rows["cs"][6] == "250 (2/2 seeds)"
    assert rows["cs"][2] == "-21% (-84% to +292%)" and rows["cs"][7] == "1.6x (0.12 to 21)"
    assert rows["none"][2] == rows["none"][7] == "(baseline)"
    assert rows["sqrt2"][6] == "not reached (0/2)" and rows["sqrt2"][7] == "n/a"
    # the seeds pair by value, not by position: cs ends at 0.8 of none's FD in both seeds, and
    # listed in the other order it still does (by position it would read 1.6 and 0.4)
    pairs = study(
        {
            "none": [fd_curve([(100, 10)]), fd_curve([(100, 20)])],
            "cs": [fd_curve([(100, 8)]), fd_curve([(100, 16)])],
        }
    )
    pairs["cs"].reverse()
    none, cs = summarise(pairs, "none")
    assert summary_table([none, cs], "none").splitlines()[3].split("|")[3].strip() == "-20% (-20% to -20%)"


def test_mean_ci_matches_the_t_interval():
    mean, half = mean_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    assert mean == 3.0
    t95 = 2.7764451051977987  # two-sided 95% Student t quantile, 4 degrees of freedom
    assert half == pytest.approx(t95 * math.sqrt(2.5) / math.sqrt(5), rel=1e-12)
    assert math.isnan(mean_ci([7.0])[1])
    # beyond 30 degrees of freedom too (the quantile tends to 1.96, never reaching it)
    _, half = mean_ci([0.0, 1.0] * 25)
    assert half == pytest.approx(2.0095752371292392 * 0.5050762722761054 / math.sqrt(50), rel=1e-12)


def test_parse_methods_rejects_unknown_and_repeated():
    assert parse_methods("none, cs,ls") == ["none", "cs", "ls"]
    with pytest.raises(ScaleLongError, match="choose from"):
        parse_methods("none,foo")
    with pytest.raises(ScaleLongError, match="twice"):
        parse_methods("cs,cs")


@pytest.mark.slow
def test_compare_command_writes_every_plot_and_the_table(tmp_path, capsys):
    overrides = tiny_uvit_overrides("cmp", tmp_path, steps=6, method="none") + [
        "model.uvit.depth=4",
        "diagnostics.every=2",
        "eval.every=3",
        "eval.num_samples=16",
        "eval.steps=2",
        "eval.batch_size=16",
        "eval.final_num_samples=0",
        "train.checkpoint_every=3",
    ]
    command = ["compare", "configs/demo_uvit.yaml", "--methods", "none,cs,ls", "--no-progress", *overrides]
    assert main(command) == 0
    stdout = capsys.readouterr().out
    report = tmp_path / "cmp-compare"
    for name in (
        "report.md",
        "report.html",
        "loss.png",
        "feature_norm.png",
        "grad_oscillation.png",
        "fd.png",
        "coefficients_ls.png",
    ):
        assert (report / name).is_file(), name
    rows = [line for line in stdout.splitlines() if line.startswith("| ")]
    assert [r.split("|")[1].strip() for r in rows[1:]] == ["none", "cs", "ls"]
    assert "| confident digits (real 0.96) | class balance (real 1.00) |" in rows[0]  # fd-mnist: beside FD
    assert "Held-out real digits score 0.96 and 1.00" in " ".join(stdout.split())
    assert "data:image/png;base64," in (report / "report.html").read_text()
    # the network compared, in its own size words
    assert "uvit (depth 4, width 32), data mnist, 6 steps" in (report / "report.md").read_text()
    # a second call reuses the finished runs instead of training again
    assert main(command) == 0
    assert "parameters" not in capsys.readouterr().out


# ----------------------------------------------------------------------------- the divergence rule


def log(losses, features=None, every=10, **extra):
    """Records as the trainer logs them: a loss (absent: no finite step) and a feature norm."""
    out = []
    for k, loss in enumerate(losses):
        r = {"step": (k + 1) * every, "nonfinite_steps": 0 if loss is not None else every, **extra}
        if loss is not None:
            r["loss"] = loss
        if features is not None:
            r["feature_norm"] = features[k]
        out.append(r)
    return out


HEALTHY = log([1.0, 0.9, 0.8, 0.6, 0.4, 0.3, 0.25, 0.2], [5, 6, 8, 9, 12, 15, 18, 20], spikes=3)


def test_a_healthy_run_is_not_flagged_and_spikes_are_not_divergence():
    assert divergence(HEALTHY, warmup_steps=20) == []


def test_a_stop_on_nonfinite_steps_is_criterion_a():
    stopped = {"step": 37, "kind": "nonfinite", "message": "..."}
    found = divergence(HEALTHY[:3], stopped=stopped, warmup_steps=30)  # loss: not judged yet
    assert [(d.criterion, d.step) for d in found] == [("nonfinite", 37)]
    # a run that ended on non-finite steps without hitting the limit counts too
    ended = log([1.0, 0.9, None, None], [5, 6, math.nan, math.nan])
    assert [(d.criterion, d.step) for d in divergence(ended)] == [("nonfinite", 40)]


def test_collapse_without_nonfinite_steps_is_caught_by_the_loss_and_feature_growth_is_reported():
    # the demo U-ViT at lr 3e-2: loss stuck near 1.0, feature norms near 1e7, nothing non-finite
    losses = [1.02, 0.99, 1.01, 0.97, 1.0, 0.98, 1.01, 0.99]
    features = [6.0, 80.0, 2e3, 5e4, 1e6, 8e6, 1e7, 1.2e7]
    found = divergence(log(losses, features), warmup_steps=20)
    assert [(d.criterion, d.step) for d in found] == [("loss", 80)]  # judged up to the last logged loss
    assert "0.8 x its start 1.01" in found[0].detail
    # the growth is a number beside the verdict, from the end of warm-up (step 20: 80), not the first log
    assert feature_growth(log(losses, features), warmup_steps=20) == pytest.approx(1.2e7 / 80.0)
    assert feature_growth(log(losses, features), warmup_steps=0) == pytest.approx(1.2e7 / 6.0)


def x0_probe(record, error, mean_image=0.2):
    return {
        **record,
        **{f"noise/x0_mse@{lv:.2f}": error for lv in (0.1, 0.5, 0.9)},
        "noise/x0_mse_mean_image": mean_image,
    }


def test_a_run_that_logged_a_held_out_error_is_judged_by_it_not_by_its_loss():
    """The held-out x0 error against the mean image's decides: a run whose loss looks collapsed but
    denoises held-out images better than the mean image trained; one whose loss fell but whose
    final error is no better than the mean image failed, whatever the loss did."""
    stuck = log([1.02, 0.99, 1.01, 0.97, 1.0, 0.98, 1.01, 0.99])
    assert [d.criterion for d in divergence(stuck, warmup_steps=20)] == ["loss"]
    learnt = [*stuck[:-1], x0_probe(stuck[-1], 0.15)]
    assert divergence(learnt, warmup_steps=20) == []
    fell = log([1.0, 0.8, 0.6, 0.4, 0.3, 0.3])
    worse = [*fell[:-1], x0_probe(fell[-1], 0.23)]
    (found,) = divergence(worse)
    assert (found.criterion, found.step) == ("x0", 60)
    assert found.detail == "final held-out x0 error 0.23 is not below the mean image's 0.2"
    nan_out = [*fell[:-1], x0_probe(fell[-1], math.nan)]
    assert [d.detail for d in divergence(nan_out)] == ["its final held-out x0 error is not finite"]
    # the untrained model's probe at step 0 is no final error: the loss judges
    assert divergence([x0_probe({"step": 0}, 0.9), *fell]) == []


def test_a_network_that_predicts_the_noise_is_judged_by_its_noise_error():
    """An eps network's x0 error divides its noise error by alpha^2: 0.01 of noise error at a level
    where alpha^2 = 1e-3 is an x0 error of 10, far past the mean image's 0.2, in a run that trained.
    Its noise error against 1, the error of predicting no noise, judges it."""
    fell = log([1.0, 0.8, 0.6, 0.4, 0.3, 0.3])

    def probed(eps_error):
        return [
            *fell[:-1],
            {**x0_probe(fell[-1], 10.0), **{f"noise/eps_mse@{lv:.2f}": eps_error for lv in (0.1, 0.5, 0.9)}},
        ]

    assert divergence(probed(0.05), prediction="eps") == []
    assert [d.criterion for d in divergence(probed(0.05))] == ["x0"]  # read as x0, it would fail
    (found,) = divergence(probed(1.02), prediction="eps")
    assert (found.criterion, found.step) == ("eps", 60)
    assert found.detail == "final held-out eps error 1.02 is not below 1, the error of predicting no noise"
    assert [d.detail for d in divergence(probed(math.inf), prediction="eps")] == [
        "its final held-out eps error is not finite"
    ]


def test_an_x0_failure_says_whether_its_loss_collapsed_or_never_fell():
    """merge-norm seed 3 at 6e-3 in fp16: trained to 0.23, rose to 0.75 at step 350 and stayed; seed 1
    at 2e-2 never left 0.6-0.9. Both end worse than the mean image; only the first is a collapse. A
    spike the run came back from is no collapse."""
    collapsed = log([1.1, 0.5, 0.3, 0.24, 0.22, 0.23, 0.9, 0.8, 0.75, 0.7, 0.72, 0.7], every=50)
    (found,) = divergence([*collapsed[:-1], x0_probe(collapsed[-1], 0.28, mean_image=0.2)])
    assert found.detail == (
        "final held-out x0 error 0.28 is not below the mean image's 0.2; the loss collapsed at step 400 "
        "(from its lowest 0.23 to 0.643; it ended at 0.707)"
    )
    assert cause(found) == "x0 after a loss collapse"
    assert loss_collapse(collapsed)[:2] == (400, pytest.approx(0.23))
    plateau = log([2.0, 0.6, 0.8, 0.9, 0.85, 0.6, 0.8, 0.6, 0.65, 0.8], every=50)
    (found,) = divergence([*plateau[:-1], x0_probe(plateau[-1], 0.27, mean_image=0.2)])
    assert cause(found) == "x0" and loss_collapse(plateau) is None
    spike = log([1.0, 0.4, 0.3, 0.25, 1.2, 1.1, 0.5, 0.3, 0.26, 0.25], every=50)  # up 4x, then back
    assert loss_collapse(spike) is None


def with_input_free(records, free):
    return [{**r, "loss_input_free": f} for r, f in zip(records, free, strict=True)]


def test_loss_is_judged_against_the_input_free_loss_when_logged():
    """x0-prediction: the loss starts far above where a collapsed run ends, so the run's own start
    is no yardstick; the loss of the best input-free guess is."""
    free = [0.55] * 8
    # learnt, then collapsed back above the input-free loss (the demo U-ViT at lr 3e-2)
    collapsed = with_input_free(log([2.9, 0.6, 0.45, 0.5, 0.7, 0.8, 0.85, 0.87]), free)
    found = divergence(collapsed, warmup_steps=20)
    assert [(d.criterion, d.step) for d in found] == [("loss", 80)]
    assert "loss ends at 0.84, 1.53 x the input-free loss 0.55 (limit 0.8 x)" in found[0].detail
    # the same start with a loss that keeps falling is healthy, though it never fell to 0.8 x its start
    healthy = with_input_free(log([2.9, 0.6, 0.45, 0.4, 0.35, 0.3, 0.28, 0.25]), free)
    assert divergence(healthy, warmup_steps=20) == []
    # the old rule would have called this one healthy (0.84 < 0.8 x its start 1.3)
    assert divergence(log([2.9, 0.6, 0.45, 0.5, 0.7, 0.8, 0.85, 0.87]), warmup_steps=20) == []
    # a stopped run is judged by (a) alone; so is a run still in warm-up
    assert divergence(collapsed, stopped={"step": 80}, warmup_steps=20)[0].criterion == "nonfinite"
    assert len(divergence(collapsed, stopped={"step": 80}, warmup_steps=20)) == 1
    assert divergence(collapsed, warmup_steps=80) == []


def test_loss_criterion_alone_and_its_named_threshold():
    slow = log([1.0, 1.0, 1.0, 0.95, 0.9, 0.85, 0.85, 0.84], [5.0] * 8)
    assert [d.criterion for d in divergence(slow)] == ["loss"]
    # smoothing: one low value does not make a run healthy, a sustained fall does
    one_dip = log([1.0, 1.0, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0])  # 0.5 alone is below 0.8, its mean is not
    assert [d.criterion for d in divergence(one_dip)] == ["loss"]
    assert divergence(slow, rule=DivergenceRule(loss_fraction=0.9)) == []


def test_loss_is_judged_after_warm_up_only_and_not_without_data():
    # it fell during warm-up and came back: the fall does not count
    back = log([1.0, 1.0, 1.0, 0.5, 0.5, 1.0, 1.0, 1.0])
    assert divergence(back, warmup_steps=0) == []
    assert [d.criterion for d in divergence(back, warmup_steps=50)] == ["loss"]
    # too short to judge: two logged losses, or none after warm-up
    assert divergence(log([1.0, 1.0])) == []
    assert divergence(log([1.0, 1.0, 1.0, 1.0]), warmup_steps=40) == []


def test_criteria_counts_seeds_and_names_what_fired():
    nonfinite, loss = Divergence("nonfinite", 3, ""), Divergence("loss", 40, "")
    assert criteria([[], [], []]) == "0/3"
    assert criteria([[nonfinite], [], [nonfinite]]) == "2/3 (nonfinite)"
    assert criteria([[loss], [nonfinite, loss]]) == "2/2 (loss, nonfinite 1)"


# ----------------------------------------------------------------------------- studies outlive their runs


def tiny_config(tmp_path, *extra):
    return load_config("configs/demo_uvit.yaml", [*learning_uvit_overrides(tmp_path), *extra])


def test_share_cores_divides_threads_and_clamps_jobs(capsys):
    assert share_cores(1, 8) == (1, 8)
    assert share_cores(2, 8) == (2, 4)
    assert share_cores(3, 8) == (3, 2)
    assert share_cores(3, 2) == (3, 1)  # single-threaded runs time-share the cores
    assert capsys.readouterr().err == "--jobs 3 on 2 cores: one thread each, the runs share the cores\n"
    assert share_cores(5, 2) == (4, 1)
    assert "--jobs 5 exceeds twice the 2 cores here; running 4 at a time" in capsys.readouterr().err
    with pytest.raises(ScaleLongError, match="--jobs must be >= 1"):
        share_cores(0, 2)


@pytest.mark.slow
def test_jobs_2_gives_the_same_runs_as_jobs_1_and_one_failure_ends_only_itself(tmp_path):
    def configs(folder):
        # 8 steps: the same numbers either way is the point, not what the runs learn
        runs = [
            tiny_config(tmp_path / folder, f"name={m}", f"model.skip.method={m}", "train.steps=8")
            for m in ("none", "cs")
        ]
        missing = [f"data.path={tmp_path}/missing", "name=broken"]
        return [*runs, tiny_config(tmp_path / folder, "data.name=cifar10", *missing)]

    sequential = run_all(configs("j1"), jobs=1, progress=False)
    pooled = run_all(configs("j2"), jobs=2, progress=False)
    assert [o.status for o in sequential] == [o.status for o in pooled] == ["trained", "trained", "failed"]
    assert "CIFAR-10 not found" in pooled[2].message and "\n" not in pooled[2].message
    # each of the 2 workers holds its share of the cores; the sequential runs keep this process's
    assert {o.threads for o in pooled[:2]} == {share_cores(2, cpu_cores())[1]}
    assert sequential[0].threads == torch.get_num_threads()
    for name in ("none", "cs"):
        a = [json.loads(line) for line in (tmp_path / "j1" / name / "metrics.jsonl").read_text().splitlines()]
        b = [json.loads(line) for line in (tmp_path / "j2" / name / "metrics.jsonl").read_text().splitlines()]
        assert [r["loss"] for r in a] == pytest.approx([r["loss"] for r in b], rel=1e-6)


@pytest.mark.slow
def test_compare_with_a_diverging_run_still_writes_its_report(tmp_path):
    calls = []

    def poison_none(step, trainer):  # a step hook: the baseline's weights turn NaN after step 5
        calls.append(trainer.cfg.name)
        if step == 5 and trainer.cfg.model.skip.method == "none":
            with torch.no_grad():
                for p in trainer.model.parameters():
                    p.fill_(math.nan)

    base = tiny_config(
        tmp_path,
        "eval.every=20",
        "eval.num_samples=16",
        "eval.steps=2",
        "eval.batch_size=16",
        "eval.final_num_samples=0",
    )
    hooks = {"step_hooks": [poison_none]}
    result = run_comparison(base, ["none", "cs"], 1, tmp_path / "cmp", progress=False, train_kwargs=hooks)
    assert [o.status for o in result.outcomes] == ["stopped", "trained"]
    report = (tmp_path / "cmp" / "report.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in result.table.splitlines()[2:]}
    assert rows["none"].endswith("| 1/1 (nonfinite) |")
    assert "nonfinite" not in rows["cs"]  # 20 steps: it may not yet beat the mean image (x0), no more
    assert "- `none-seed0`: nonfinite at step 8" in report  # 5 + 3 non-finite steps in a row
    assert (tmp_path / "cmp" / "report.html").is_file()
    # a rerun reuses both runs, the stopped one included
    n = len(calls)
    again = run_comparison(base, ["none", "cs"], 1, tmp_path / "cmp", progress=False, train_kwargs=hooks)
    assert len(calls) == n and [o.status for o in again.outcomes] == ["reused", "reused"]


def test_the_report_names_the_network_by_its_size():
    from scalelong.studies.compare.report import network_words

    assert (
        network_words(load_config("demo").model)
        == "unet (16 channels x [1, 2, 4], 1 residual block(s) a level)"
    )
    assert network_words(load_config("demo_uvit").model) == "uvit (depth 12, width 64)"
    assert network_words(load_config("demo", ["model.type=diffusers_unet2d"]).model) == "diffusers_unet2d"


# ----------------------------------------------------------------------------- run folders a study finds


def test_a_concluded_run_of_another_length_or_eval_is_refused_not_relabelled(tmp_path):
    """A finished run differs from the plan in a key that resuming frees (train.steps, eval.*): a
    study would rewrite its config and call it trained; refused in one line. Unfinished, it resumes."""
    cfg = tiny_config(tmp_path, "name=r", "train.steps=4")
    train(cfg, progress=False)
    run = RunDir(cfg.run_dir)
    assert run.finished and reusable(run, cfg)
    check_run_dirs([cfg])
    for change in ("train.steps=2", "train.steps=8", "eval.every=2"):
        with pytest.raises(
            ScaleLongError, match=r"finished run of another config \((train.steps|eval.every)"
        ):
            check_run_dirs([tiny_config(tmp_path, "name=r", "train.steps=4", change)])
    summary = run.summary
    run.write_summary({**summary, "status": "interrupted"})  # unfinished: resuming it is legitimate
    check_run_dirs([tiny_config(tmp_path, "name=r", "train.steps=8")])


def test_an_emptied_config_yaml_is_read_from_the_checkpoint_not_called_another_config(tmp_path):
    """config.yaml emptied (training recovers it from the checkpoint): the run is still this config's,
    reused, and a plan of another length is still refused; a folder holding no run is refused."""
    cfg = tiny_config(tmp_path, "name=r", "train.steps=4")
    train(cfg, progress=False)
    run = RunDir(cfg.run_dir)
    run.config_file.write_text("")
    check_run_dirs([cfg])
    assert reusable(run, cfg) and plan_table([cfg]).splitlines()[1].endswith("reuse")
    with pytest.raises(ScaleLongError, match="finished run of another config"):
        check_run_dirs([tiny_config(tmp_path, "name=r", "train.steps=2")])
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("mine")
    with pytest.raises(ScaleLongError, match="holds no run whose config can be read"):
        check_run_dirs([tiny_config(tmp_path, "name=junk")])


def test_a_file_where_the_study_folder_would_be_is_refused_before_the_dry_run(tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ScaleLongError, match="is not a folder"):
        check_run_dirs([tiny_config(tmp_path / "file" / "below", "name=r")])
    overrides = tiny_uvit_overrides("cmp", tmp_path, steps=4)
    command = ["compare", "configs/demo_uvit.yaml", "--methods", "none", "--no-progress", *overrides]
    for out in (tmp_path / "file", tmp_path / "file" / "report"):
        assert main([*command, "--out", str(out), "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "is not a folder" in err and len(err.splitlines()) == 1


def test_a_run_on_several_processes_fails_alone_when_one_dies_and_stops_the_study_only_if_interrupted(
    tmp_path, monkeypatch
):
    """--gpus-per-run 2: the launcher gets the run's folder (it writes the summary and its line); a
    process that died (the others stopped, rank 0's summary "interrupted") fails this run only; this
    process interrupted raises TrainingInterrupted."""
    cfg = tiny_config(tmp_path, "name=r")
    launched = []

    def died(n, args, ignore_signals=(), run_dir=None):
        launched.append(run_dir)
        Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
        error = f"rank 1 of {n} processes was killed by SIGKILL; the others were stopped (workers.log)"
        RunDir(cfg.run_dir).write_summary({"status": "interrupted", "error": error, "steps": 0})
        return 1

    monkeypatch.setattr(scalelong.studies.running, "launch_processes", died)
    outcome = train_run(cfg, processes=2)
    assert launched == [cfg.run_dir]
    assert (outcome.status, outcome.message) == (
        "failed",
        "rank 1 of 2 processes was killed by SIGKILL; the others were stopped (workers.log)",
    )

    def interrupted(n, args, ignore_signals=(), run_dir=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(scalelong.studies.running, "launch_processes", interrupted)
    with pytest.raises(TrainingInterrupted):
        train_run(cfg, processes=2)
