"""The reading of a comparison (its table in plain sentences), where it is shown, and the
study commands' --dry-run."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

from conftest import tiny_uvit_overrides
from scalelong.cli import main
from scalelong.studies.compare import summarise, write_report
from scalelong.studies.compare.reading import fig1_order, reading
from scalelong.studies.divergence import Divergence
from scalelong.studies.running import RunOutcome, StudyResult
from scalelong.studies.summary import MethodSummary, SeedSummary, StudyRun
from scalelong.training.config import load_config
from scalelong.training.runs import evaluation_lines
from scalelong.training.train import _rescore


def summary(
    method: str,
    fd: float | list[float] = 50.0,
    confident: float = 0.8,
    norm: float = 10.0,
    steps: int | None = 600,
    breaks: list[list[Divergence]] | None = None,
    seeds: int = 1,
) -> MethodSummary:
    """A method's summary, seeds 0, 1, ..., with the same value for every seed unless given per
    seed; ``steps``: when each seed reached the baseline's final FD (the baseline's own: when it
    first reached its final FD)."""
    fds = fd if isinstance(fd, list) else [fd] * seeds
    breaks = breaks if breaks is not None else [[] for _ in fds]
    runs = [
        SeedSummary(k, f, final_loss=0.05, feature_norm=norm, confident=confident, breaks=tuple(b))
        for k, (f, b) in enumerate(zip(fds, breaks, strict=True))
    ]
    return MethodSummary(method, runs, [steps] * len(fds))


def sentences(text: str) -> list[str]:
    return re.split(r"(?<=\.) (?=[A-Z])", text)


def test_one_seed_says_no_difference_is_evidence():
    text = reading([summary("none"), summary("cs", fd=40.0)], "none", 100, 700, 1)
    assert sentences(text)[0] == (
        "With 1 seed, no difference in this table is evidence: on small models seed-to-seed noise is "
        "larger than the effect, so train --seeds 5 or more before concluding."
    )
    assert "95% interval" not in text
    assert reading([summary("none", seeds=4)], "none", 100, 700, 4).startswith("With 4 seeds, no difference")


def test_five_seeds_name_the_paired_differences_whose_interval_excludes_0():
    def changed(method: str, changes: list[float]) -> MethodSummary:  # final FD 50 x (1 + change) a seed
        return summary(method, fd=[50.0 * (1 + c) for c in changes])

    methods = [
        summary("none", seeds=5),
        changed("cs", [-0.30, -0.28, -0.32, -0.29, -0.31]),  # clear
        changed("sqrt2", [0.05, -0.06, 0.02, -0.03, 0.07]),  # noise around +1%
    ]
    first = sentences(reading(methods, "none", 100, 700, 5))[0]
    # cs, on the logs of its per-seed ratios 0.70, 0.72, ...: mean -0.3569 (a geometric mean ratio
    # of 0.6999, -30%), sd 0.02259, t(0.975, 4) 2.776 -> exp(-0.3569 ± 0.02805) - 1: -32% to -28%
    assert first == (
        "With 5 seeds, the 95% interval of the paired change in final FD against none excludes 0 for "
        "cs (-30%, -32% to -28%); it includes 0 for sqrt2 (+0.9%, -5.7% to +7.9%): that difference is "
        "not evidence."
    )
    methods[2] = changed("sqrt2", [0.10, 0.12, 0.11, 0.09, 0.13])
    assert "excludes 0 for cs (-30%, -32% to -28%) and sqrt2 (+11%, +9.0% to +13%)." in reading(
        methods, "none", 100, 700, 5
    )


def test_a_change_on_fewer_pairs_than_seeds_is_not_tested():
    """Five seeds, but cs has a finite FD on one of them: one pair, no interval, nothing to test."""
    methods = [summary("none", seeds=5), summary("cs", fd=[45.0, math.nan, math.nan, math.nan, math.nan])]
    assert reading(methods, "none", 100, 700, 5).startswith(
        "With 5 seeds, no paired change in final FD against none was tested: cs (-10.0% on 1) paired "
        "fewer than 5 seeds with a finite final FD, too few to test."
    )
    methods.append(summary("sqrt2", fd=[50.0 * (1 + c) for c in (0.05, -0.06, 0.02, -0.03, 0.07)]))
    assert reading(methods, "none", 100, 700, 5).startswith(
        "With 5 seeds, the 95% interval of the paired change in final FD against none includes 0 for "
        "sqrt2 (+0.9%, -5.7% to +7.9%): no difference in final FD is evidence. cs (-10.0% on 1) paired "
        "fewer than 5 seeds"
    )


def test_a_method_at_fd_350_is_named_as_not_drawing_digits():
    methods = [summary("none", fd=120.0), summary("sqrt2", fd=350.0, confident=0.7), summary("cs", fd=60.0)]
    text = reading(methods, "none", 100, 700, 1)
    assert (
        "sqrt2 (FD 350, 70% confident) did not end drawing digits (final FD <= 200 and at least 50% of "
        "the samples confident digits); the others did."
    ) in text
    # a low confident-digit share fails the bar as well, and so does a run without a finite FD
    methods = [summary("none", confident=0.3), summary("cs", fd=math.nan)]
    assert "No method ended drawing digits" in reading(methods, "none", 100, 700, 1)
    assert "none (FD 50, 30% confident) and cs (no finite FD, 80% confident)" in reading(
        methods, "none", 100, 700, 1
    )
    assert "Every method ended drawing digits" in reading([summary("none")], "none", 100, 700, 1)
    # without a digit score (FID runs) the digit sentence is left out
    fid = [summary("none", fd=300.0, confident=math.nan)]
    assert "digits" not in reading(fid, "none", 100, 700, 1)


def test_the_final_fd_sentence_names_the_lowest_and_highest():
    methods = [
        summary("none", fd=55.04),
        summary("sqrt2", fd=48.1),
        summary("cs", fd=41.23),
        summary("ls", fd=123.4),
    ]
    assert (
        "The final FD (1 seed) is lowest for cs (41.2) and highest for ls (123); sqrt2 48.1, none 55."
        in reading(methods, "none", 100, 700, 1)
    )


def test_the_feature_norm_sentence_says_whether_it_orders_as_fig_1():
    paper = [
        summary("none", norm=20.0),
        summary("sqrt2", norm=14.0),
        summary("cs", norm=9.0),
        summary("ls", norm=10.4),
    ]
    text = reading(paper, "none", 100, 700, 1)
    assert (
        "The hidden-feature norm at the end (1 seed) is 20 for none; as a ratio to it, sqrt2 0.70x, "
        "cs 0.45x, ls 0.52x: the order of the paper's Fig. 1 (none highest, then sqrt2, then cs and ls)."
    ) in text
    other = [summary("none", norm=10.0), summary("sqrt2", norm=14.0), summary("cs", norm=9.4)]
    assert (
        "as a ratio to it, sqrt2 1.40x, cs 0.94x: not the order of the paper's Fig. 1 (none highest, then "
        "sqrt2, then cs and ls), but sqrt2 > none > cs."
    ) in reading(other, "none", 100, 700, 1)
    assert fig1_order({"none": 3.0, "cs": 2.0, "ls": 1.0}) is True
    assert fig1_order({"none": 3.0, "cs": 2.0, "ls": 4.0}) is False  # ls above the baseline
    assert fig1_order({"cs": 2.0, "ls": 1.0}) is None  # one group only: nothing to order
    no_base = [summary("none", norm=math.nan), summary("sqrt2", norm=6.0), summary("cs", norm=4.0)]
    assert "norm at the end (1 seed) is sqrt2 6, cs 4: the order of the paper's" in reading(
        no_base, "none", 100, 700, 1
    )
    unlogged = [summary("none", norm=math.nan)]
    assert "No run logged the hidden-feature norm" in reading(unlogged, "none", 100, 700, 1)


def test_the_resolution_sentence_gives_the_smallest_speed_up_the_spacing_can_show():
    fine = [summary("none", steps=600), summary("cs", steps=400)]
    text = reading(fine, "none", 100, 700, 1)
    assert "none first reached its final FD at step 600; speed-up to that FD: cs 1.50x." in text
    assert (
        "With evaluations every 100 of 700 steps, the smallest speed-up that can show is 600 / 500 = 1.20x."
        in text
    )
    coarse = [summary("none", steps=200), summary("cs", steps=None)]
    text = reading(coarse, "none", 100, 200, 1)
    assert "cs never reached it" in text
    assert (
        "the smallest speed-up that can show is 200 / 100 = 2.00x, so 1.5x cannot be resolved: evaluate "
        "more often (eval.every) or train longer."
    ) in text
    assert "so no speed-up can show" in reading([summary("none", steps=100)], "none", 100, 700, 1)
    # exactly 1.5x (S = 3E) is resolvable
    assert "300 / 200 = 1.50x." in reading([summary("none", steps=300)], "none", 100, 700, 1)
    # a last step that is no multiple of E is evaluated too: the evaluation before it is the last multiple
    assert "every 1400 of 2100 steps, the smallest speed-up that can show is 2100 / 1400 = 1.50x." in reading(
        [summary("none", steps=2100)], "none", 1400, 2100, 1
    )


def test_divergences_and_runs_without_evaluations():
    broke = [[Divergence("loss", 40, "x")], []]
    methods = [summary("none", seeds=2), summary("sqrt2", breaks=broke, seeds=2)]
    text = reading(methods, "none", 100, 700, 2)
    assert text.endswith("Diverged: sqrt2 in 1/2 seeds (loss).")
    assert reading([summary("none")], "none", 100, 700, 1).endswith("No run diverged.")
    text = reading([summary("none", fd=math.nan), summary("cs", fd=math.nan)], "none", 0, 700, 1)
    assert "No run was evaluated (eval.every=0), so there is no FD, digit score or speed-up to read" in text
    assert "speed-up that can show" not in text and "drawing digits" not in text


def test_a_reading_is_one_paragraph_of_at_most_seven_sentences():
    seeds = 5
    methods = [
        summary(m, fd=[40.0 + k for k in range(seeds)], seeds=seeds) for m in ("none", "sqrt2", "cs", "ls")
    ]
    text = reading(methods, "none", 100, 700, seeds)
    assert "\n" not in text and 4 <= len(sentences(text)) <= 7


def test_summaries_carry_the_last_feature_norm():
    records = [{"step": 10, "feature_norm": 4.0, "fd": 9.0}, {"step": 20, "feature_norm": 6.0, "fd": 8.0}]
    (s,) = summarise({"none": [StudyRun("none-seed0", records, {}, [], seed=0)]}, "none")
    assert s.values("feature_norm") == [6.0]


def test_the_report_puts_the_reading_right_under_the_table(tmp_path):
    def records(norm: float) -> list[dict]:
        return [{"step": 50 * k, "loss": 1.0 / k, "feature_norm": norm * k, "fd": 300.0 / k} for k in (1, 2)]

    studies = {
        m: [StudyRun(f"{m}-seed0", records(n), {}, [], seed=0)] for m, n in (("none", 4.0), ("cs", 2.0))
    }
    base = load_config(None, ["train.steps=100", "eval.every=50"])
    path, table = write_report(studies, "none", tmp_path, base)
    paragraphs = path.read_text().split("\n\n")
    at = paragraphs.index(table)
    assert paragraphs[at + 1].startswith("With 1 seed, no difference in this table is evidence")
    assert "cs 0.50x: the order of the paper's Fig. 1" in paragraphs[at + 1]
    page = (tmp_path / "report.html").read_text()
    assert "</table></div>\n<p>With 1 seed, no difference" in page


# ----------------------------------------------------------------------------- the command line


def fake_result(folder: Path, failed: bool = False) -> StudyResult:
    outcomes = [RunOutcome("none-seed0", "failed" if failed else "trained", "boom" if failed else "")]
    return StudyResult(folder / "report.md", "| method |\n|---|", outcomes, reading="With 1 seed, it reads.")


def test_compare_prints_the_reading_and_ends_with_the_path_of_report_html(tmp_path, monkeypatch, capsys):
    import scalelong.studies.compare

    monkeypatch.setattr(
        scalelong.studies.compare, "run_comparison", lambda *a, **k: fake_result(tmp_path / "r")
    )
    assert main(["compare", "demo", "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out.rstrip().splitlines()
    assert out.index("With 1 seed, it reads.") > out.index("| method |")
    assert out[-2] == f"report: {tmp_path / 'r' / 'report.md'}"
    assert out[-1].strip() == str(tmp_path / "r" / "report.html")
    # runs that failed: the paths still come, then the one-line error
    monkeypatch.setattr(
        scalelong.studies.compare, "run_comparison", lambda *a, **k: fake_result(tmp_path, True)
    )
    assert main(["compare", "demo"]) == 2
    captured = capsys.readouterr()
    assert captured.out.rstrip().endswith(str(tmp_path / "report.html"))
    assert captured.err.startswith("error: 1 of 1 runs failed")


def study_args(tmp_path) -> list[str]:
    return ["configs/demo_uvit.yaml", *tiny_uvit_overrides("s", tmp_path / "out"), "--methods", "none,cs"]


def test_compare_dry_run_lists_the_runs_and_the_first_config_and_writes_nothing(tmp_path, capsys):
    assert main(["compare", *study_args(tmp_path), "--seeds", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert (
        lines[0]
        == f"4 runs in {tmp_path / 'out' / 's-compare' / 'runs'}; report in {tmp_path / 'out' / 's-compare'}"
    )
    assert lines[1].split() == ["run", "method", "seed", "lr", "depth", "action"]
    assert [line.split() for line in lines[2:6]] == [
        ["none-seed0", "none", "0", "0.005", "2", "new"],
        ["cs-seed0", "cs", "0", "0.005", "2", "new"],
        ["none-seed1", "none", "1", "0.005", "2", "new"],
        ["cs-seed1", "cs", "1", "0.005", "2", "new"],
    ]
    assert "name: none-seed0" in out and "model: uvit," in out and "data: MNIST" in out
    assert not any(tmp_path.iterdir())  # nothing written


def test_sweep_dry_run_lists_every_cell(tmp_path, capsys):
    argv = ["sweep", *study_args(tmp_path), "--lrs", "1e-2,2e-2", "--depths", "2,4", "--dry-run"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("8 runs in ") and "s-sweep" in lines[0]
    names = [line.split()[0] for line in lines[2:10]]
    assert names[:2] == ["d2-lr0.01-none-seed0", "d2-lr0.01-cs-seed0"] and names[-1] == "d4-lr0.02-cs-seed0"
    assert lines[9].split()[1:] == ["cs", "0", "0.02", "4", "new"]
    assert not any(tmp_path.iterdir())


def test_dry_run_refuses_what_the_study_would_refuse(tmp_path, capsys):
    # an odd depth (sweep: cell validation; compare: the model check)
    assert main(["sweep", *study_args(tmp_path), "--depths", "3", "--dry-run"]) == 2
    assert "model.uvit.depth must be an even number" in capsys.readouterr().err
    # a model that rejects its input: named by its run, as before a study's first run
    assert (
        main(
            [
                "compare",
                *study_args(tmp_path),
                "model.uvit.patch_size=16",
                "--methods",
                "none,ls",
                "--dry-run",
            ]
        )
        == 2
    )
    assert "run ls-seed0: model.uvit: the U-ViT rejects this config" in capsys.readouterr().err
    # a run folder that holds another config's run
    folder = tmp_path / "out" / "s-compare" / "runs" / "none-seed0"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("name: other\ntrain:\n  seed: 7\n")
    assert main(["compare", *study_args(tmp_path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "holds a run of another config" in err and err.count("\n") == 1


# ----------------------------------------------------------------------------- the re-score's line


def test_the_best_step_line_carries_the_digit_score(tmp_path, capsys):
    """The trainer re-scores the best step into the summary and says nothing; the command line
    prints it once, among its evaluation lines, with FD-MNIST's digit score beside it."""
    final = {
        "best_step": 500,
        "fd_metric": "fd-mnist",
        "fd": 41.234,
        "fd_samples": 1000,
        "digits/confident": 0.834,
        "digits/entropy": 0.97,
    }
    evaluator = SimpleNamespace(finalize=lambda: final)
    trainer = SimpleNamespace(evaluator=evaluator, acc=SimpleNamespace(is_main_process=True))
    assert _rescore(trainer) is final
    assert capsys.readouterr().out == ""
    last = {"fd_metric": "fd-mnist", "fd": 45.0, "fd_samples": 8, "fd_sampler": "dpm_solver", "fd_steps": 2}
    run = SimpleNamespace(eval_records=lambda: {500: last}, eval_final_file=tmp_path / "eval_final.json")
    run.eval_final_file.write_text(json.dumps(final))
    line = evaluation_lines(run)[-1]
    assert re.fullmatch(
        r"best step 500 re-scored: fd-mnist 41\.2 \(1000 samples\); digits: confident 0\.83 "
        r"\(real digits 0\.\d\d\), class balance 0\.97 \(real digits \d\.\d\d\)",
        line,
    ), line
    fid = {k: v for k, v in final.items() if not k.startswith("digits/")} | {"fd_metric": "fid"}
    run.eval_final_file.write_text(json.dumps(fid))
    assert evaluation_lines(run)[-1] == "best step 500 re-scored: fid 41.2 (1000 samples)"
    run.eval_final_file.write_text(json.dumps(fid | {"fd_samples_reused": 256}))  # the evaluation's first 256
    assert (
        evaluation_lines(run)[-1]
        == "best step 500 re-scored: fid 41.2 (1000 samples, 256 of them the evaluation's)"
    )
