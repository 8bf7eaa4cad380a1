"""The run directory: its paths, the metrics log, checkpoints and the one model loader."""

import math

import pytest
import torch
import yaml

from conftest import TINY_UVIT as TINY
from scalelong.errors import ScaleLongError
from scalelong.training.build import build_model
from scalelong.training.checkpoint import save_checkpoint
from scalelong.training.config import config_to_dict, load_config, save_config
from scalelong.training.runs import MetricsLog, RunDir, config_differences, load_model


def test_the_layout_of_a_run_directory(tmp_path):
    run = RunDir(tmp_path / "demo")
    names = {
        run.config_file: "config.yaml",
        run.metrics_file: "metrics.jsonl",
        run.tb_dir: "tb",
        run.checkpoint(500): "checkpoints/step-000500",
        run.sample_grid(500): "samples/step-000500.png",
        run.eval_dir: "eval",
        run.eval_final_file: "eval_final.json",
        run.report_dir: "report",
        run.summary_file: "summary.json",
    }
    for path, name in names.items():
        assert path == tmp_path / "demo" / name
    assert run.checkpoints_dir == run.checkpoint(500).parent
    assert RunDir(run).path == run.path and str(run) == str(tmp_path / "demo") and run.name == "demo"


def test_metrics_log_round_trip_keeps_nonfinite_values(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"step": 1, "loss": math.nan, "fd_metric": "fd-mnist", "grad_norm": math.inf})
    log.write({"step": 2, "loss": 0.5, "grad_norm": -math.inf})
    log.write({"step": 3, "loss": 0.25})
    assert '"loss": "nan"' in log.path.read_text()  # JSON has no NaN: written as a string
    first, second, _ = log.read()
    assert math.isnan(first["loss"]) and first["grad_norm"] == math.inf and first["fd_metric"] == "fd-mnist"
    assert second["grad_norm"] == -math.inf
    log.truncate_after(2)
    assert [r["step"] for r in log.read()] == [1, 2] and math.isnan(log.read()[0]["loss"])
    assert MetricsLog(tmp_path / "none.jsonl").read() == []


def test_not_a_run_and_missing_checkpoints_are_one_line_errors(tmp_path):
    run = RunDir(tmp_path / "empty")
    with pytest.raises(ScaleLongError, match="not a run directory"):
        run.config()
    cfg = load_config(None, TINY)
    run.path.mkdir()
    save_config(cfg, run.config_file)
    with pytest.raises(ScaleLongError, match="no checkpoint yet"):
        run.load_model()
    model = build_model(cfg.model)
    save_checkpoint(run.checkpoints_dir, 4, model, model, config_to_dict(cfg))
    with pytest.raises(ScaleLongError, match="no checkpoint for step 3 .* available: step-000004"):
        run.find_checkpoint(3)
    assert run.find_checkpoint() == run.checkpoint(4) == run.find_checkpoint(4)
    assert not run.finished
    run.write_summary({"steps": 4})
    assert run.finished


def test_one_loader_for_a_run_and_for_a_bare_checkpoint(tmp_path):
    cfg = load_config(None, TINY)
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    save_config(cfg, run.config_file)
    model = build_model(cfg.model)
    with torch.no_grad():
        for p in model.skip_scaling.parameters():
            p.add_(1.0)  # not the initialisation, so loading must really copy
    ema = build_model(cfg.model)
    ckpt = save_checkpoint(run.checkpoints_dir, 2, model, ema, config_to_dict(cfg))
    rng = torch.get_rng_state()
    loaded_cfg, from_run, path = run.load_model(weights="model")
    from_meta = load_model(ckpt, weights="model")  # the config stored in meta.json
    assert torch.equal(torch.get_rng_state(), rng)  # building the model leaves the RNG alone
    assert path == ckpt and loaded_cfg.model == cfg.model and not from_run.training
    for k, v in model.state_dict().items():
        assert torch.equal(from_run.state_dict()[k], v) and torch.equal(from_meta.state_dict()[k], v), k
    assert torch.equal(load_model(ckpt).pos_embed, ema.pos_embed)  # EMA weights by default
    with pytest.raises(ScaleLongError, match="choose ema or model"):
        load_model(ckpt, weights="best")
    with pytest.raises(ScaleLongError, match="meta.json is missing"):
        load_model(tmp_path)


# ----------------------------------------------------------------------------- the metrics log


def test_a_torn_last_line_is_dropped_with_one_warning(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl", warn=(warnings := []).append)
    log.write({"step": 1, "loss": 0.5})
    log.write({"step": 2, "loss": 0.4})
    with log.path.open("a") as f:
        f.write('{"step": 3, "lo')  # a kill in the middle of a write
    assert [r["step"] for r in log.read()] == [1, 2]
    assert [r["step"] for r in log.read()] == [1, 2]
    assert len(warnings) == 1 and "last line is cut short" in warnings[0]  # once, however often it is read
    log.truncate_after(5)  # what a resumed run does first: the file is whole again
    assert log.path.read_text() == '{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n'
    assert not list(tmp_path.glob(".*tmp"))
    log.path.write_text('{"step": 1}\nnot json\n[1, 2]\n{"step": 4}\n')
    assert [r["step"] for r in log.read()] == [1, 4]
    assert "line(s) 2, 3 are not JSON records" in warnings[-1]


def test_a_resume_moves_damaged_lines_to_metrics_jsonl_bad_and_deletes_none(tmp_path):
    from scalelong.runlog.tracking import Tracker

    log, bad = tmp_path / "metrics.jsonl", tmp_path / "metrics.jsonl.bad"
    damaged = [b'{"step": 2, "loss": 0.\xff4 garbled', b'{"step": null}', b'{"step": "abc", "loss": 1}']
    good = [b'{"step": 1, "loss": 0.5}', b'{"step": 2, "loss": 0.4}', b'{"step": 3, "loss": 0.3}']
    log.write_bytes(b"\n".join([good[0], *damaged, good[1], good[2]]) + b"\n")
    Tracker(tmp_path, {}, start_step=2, tensorboard=False, warn=(warnings := []).append).close()
    assert log.read_bytes() == good[0] + b"\n" + good[1] + b"\n"  # step 3 is written again
    assert bad.read_bytes() == b"".join(line + b"\n" for line in damaged)  # byte for byte, to repair
    assert len(warnings) == 1 and "line(s) 2, 3, 4 are not JSON records" in warnings[0]
    assert f"moved to {bad}" in warnings[0] and not list(tmp_path.glob(".*tmp"))
    with log.open("a") as f:
        f.write('{"step": 3, "lo')  # a later kill: its cut line joins the earlier ones, which stay
    Tracker(tmp_path, {}, start_step=2, tensorboard=False, warn=warnings.append).close()
    assert bad.read_bytes().splitlines() == [*damaged, b'{"step": 3, "lo']
    assert "its last line is cut short" in warnings[-1]
    assert [r["step"] for r in MetricsLog(log).read()] == [1, 2]


# ----------------------------------------------------------------------------- checkpoints


def test_removing_old_checkpoints_is_atomic_and_keeps_newer_ones(tmp_path, monkeypatch):
    import scalelong.training.checkpoint as ckpt
    from scalelong.training.checkpoint import list_checkpoints, remove_partial

    w = {"w": torch.ones(2)}
    for step in (2, 4, 6, 8):
        save_checkpoint(tmp_path, step, w, w, {})
    # a resume that fell back to step 4 writes step 5 with keep=2: 6 and 8 (newer, from before) stay
    save_checkpoint(tmp_path, 5, w, w, {}, keep=2)
    names = ["step-000004", "step-000005", "step-000006", "step-000008"]
    assert [p.name for p in list_checkpoints(tmp_path)] == names
    # a removal cut short after its rename leaves no step- folder, only .old-, cleaned up later
    monkeypatch.setattr(ckpt.shutil, "rmtree", lambda *a, **k: None)
    ckpt.remove_checkpoint(tmp_path / "step-000004")
    monkeypatch.undo()
    assert [p.name for p in list_checkpoints(tmp_path)] == names[1:]
    assert (tmp_path / ".old-step-000004").is_dir()
    remove_partial(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == names[1:]


def test_every_weight_load_is_verified(tmp_path):
    from scalelong.training.checkpoint import DamagedCheckpoint, load_newest

    cfg = load_config(None, TINY)
    model = build_model(cfg.model)
    good = save_checkpoint(tmp_path, 1, model, model, config_to_dict(cfg))
    bad = save_checkpoint(tmp_path, 2, model, model, config_to_dict(cfg))
    data = bytearray((bad / "ema.safetensors").read_bytes())
    data[-1] ^= 1  # one bit: still a valid safetensors file, one weight slightly off
    (bad / "ema.safetensors").write_bytes(bytes(data))
    with pytest.raises(DamagedCheckpoint, match="ema.safetensors fails its checksum"):
        load_model(bad)
    load_model(bad, weights="model")  # the raw weights of that checkpoint are intact
    warnings = []
    path, _ = load_newest([good, bad], load_model, warnings.append)
    assert (
        path == good
        and len(warnings) == 1
        and "step-000002" in warnings[0]
        and "using step-000001" in warnings[0]
    )
    (good / "ema.safetensors").write_bytes((good / "ema.safetensors").read_bytes()[:100])
    with pytest.raises(
        ScaleLongError, match=r"every checkpoint .* is damaged \(step-000002: ema.safetensors fails"
    ):
        load_newest([good, bad], load_model, warnings.append, "; restore one")
    assert len(warnings) == 1  # the all-damaged case is the one error line, no warnings before it


# ----------------------------------------------------------------------------- the run directory


def test_config_recovered_from_a_checkpoint_when_config_yaml_is_empty(tmp_path, capsys):
    cfg = load_config(None, TINY)
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.config_file.write_text("")  # cut to 0 bytes
    with pytest.raises(ScaleLongError, match="config.yaml is empty and no checkpoint") as info:
        run.config()
    assert "--overwrite" in str(info.value)
    model = build_model(cfg.model)
    save_checkpoint(run.checkpoints_dir, 3, model, model, config_to_dict(cfg))
    assert run.config().model == cfg.model
    assert "config.yaml is empty; using the config stored in step-000003" in capsys.readouterr().out


def test_overwrite_removes_only_what_scalelong_wrote(tmp_path):
    cfg = load_config(None, [*TINY, f"out_dir={tmp_path}", "name=run"])
    run = RunDir(cfg.run_dir)
    run.path.mkdir()
    save_config(cfg, run.config_file)
    model = build_model(cfg.model)
    save_checkpoint(run.checkpoints_dir, 3, model, model, config_to_dict(cfg))
    ours = [
        "metrics.jsonl",
        "summary.json",
        "eval_final.json",
        "tb/events.out.tfevents.1.host",
        "samples/step-000003.png",
    ]
    ours += [
        "eval/fd-mnist-step-000003-n16-dpm_solver3.json",
        "report/loss.png",
        "report/coefficients_ls.png",
    ]
    theirs = ["notes.txt", "samples/favourite.png", "report/my-plot.png", "checkpoints/README", "tb/keep.txt"]
    for name in ours + theirs:
        (run.path / name).parent.mkdir(parents=True, exist_ok=True)
        (run.path / name).write_text(name)
    warnings = []
    with run.writing(warnings.append):
        assert run.prepare(cfg, overwrite=True, warn=warnings.append) == []
    assert sorted(str(p.relative_to(run.path)) for p in run.path.rglob("*") if p.is_file()) == sorted(
        ["config.yaml", *theirs]
    )
    assert len(warnings) == 1 and "kept 5 file(s)" in warnings[0] and "notes.txt" in warnings[0]
    assert not run.lock_file.exists()


def test_a_run_without_a_checkpoint_starts_again_in_place_deleting_nothing(tmp_path):
    cfg = load_config(None, [*TINY, f"out_dir={tmp_path}", "name=run"])
    run = RunDir(cfg.run_dir)
    run.path.mkdir()
    save_config(cfg, run.config_file)
    (run.checkpoints_dir).mkdir()
    (run.path / "notes.txt").write_text("mine")
    warnings = []
    with run.writing(warnings.append):
        assert run.prepare(cfg, warn=warnings.append) == []
    assert warnings == [f"warning: {run.path} has no checkpoint yet; starting it again from step 0"]
    assert (run.path / "notes.txt").read_text() == "mine"
    with run.writing(), pytest.raises(ScaleLongError, match="--resume: .* has no checkpoint"):
        run.prepare(cfg, resume=True)


# ----------------------------------------------------------------------------- the lock


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def write_lock(run: RunDir, **fields) -> None:
    import json
    import socket

    record = {"pid": 1, "host": socket.gethostname(), "start": None, "since": "2024-01-01 00:00:00"}
    run.path.mkdir(parents=True, exist_ok=True)
    run.lock_file.write_text(json.dumps({**record, **fields}))


def test_the_lock_names_a_live_holder_and_takes_over_a_dead_one(tmp_path):
    import json
    import os
    import socket

    run = RunDir(tmp_path / "run")
    with run.writing():
        record = json.loads(run.lock_file.read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        with pytest.raises(ScaleLongError, match=rf"being trained by pid {os.getpid()} on host"):
            RunDir(run.path).acquire_lock()  # a second writer, even in this process
    assert not run.lock_file.exists() and not run.path.exists()  # released; the empty folder made here goes

    write_lock(run, pid=os.getppid())  # a live process of this host
    with pytest.raises(ScaleLongError, match=rf"pid {os.getppid()} on host {socket.gethostname()}"):
        run.acquire_lock()
    write_lock(run, pid=dead_pid())
    warnings = []
    run.acquire_lock(warnings.append)
    assert len(warnings) == 1 and "which no longer runs; taking the lock over" in warnings[0]
    assert json.loads(run.lock_file.read_text())["pid"] == os.getpid()
    run.release_lock()
    assert not run.lock_file.exists()


def test_a_reused_pid_unreadable_lock_and_another_host(tmp_path):
    import os

    run = RunDir(tmp_path / "run")
    write_lock(run, pid=os.getppid(), start="1")  # the pid runs, but started at another time
    run.acquire_lock((warnings := []).append)
    assert len(warnings) == 1
    run.release_lock()
    run.lock_file.write_text("")  # a crash between creating the lock and writing it
    os.utime(run.lock_file, (0, 0))
    run.acquire_lock(warnings.append)
    assert "an unreadable lock" in warnings[-1]
    run.release_lock()
    write_lock(run, pid=dead_pid(), host="elsewhere")  # cannot be checked from here: never taken over
    with pytest.raises(ScaleLongError, match="pid .* on host elsewhere .* delete .*\\.lock") as info:
        run.acquire_lock()
    assert "\n" not in str(info.value)
    write_lock(run, pid=os.getpid() + 10**6)  # releasing never removes another process's lock
    run._locked = True
    run.release_lock()
    assert run.lock_file.exists()


def test_a_file_in_the_way_of_the_run_directory(tmp_path):
    (tmp_path / "out").write_text("a file")
    for path in (tmp_path / "out", tmp_path / "out" / "run"):
        with pytest.raises(ScaleLongError, match="is a file, not a folder"):
            with RunDir(path).writing():
                pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_folder_that_holds_no_run_is_never_overwritten(tmp_path):
    cfg = load_config(None, [*TINY, f"out_dir={tmp_path}", "name=photos"])
    run = RunDir(cfg.run_dir)
    run.path.mkdir()
    for name in ("metrics.jsonl", "report/loss.png", "holiday.jpg"):  # names scalelong also uses
        (run.path / name).parent.mkdir(exist_ok=True)
        (run.path / name).write_text(name)
    for overwrite in (False, True):
        with run.writing(), pytest.raises(ScaleLongError, match="holds no run .* replaces runs only"):
            run.prepare(cfg, overwrite=overwrite)
    assert sorted(str(p.relative_to(run.path)) for p in run.path.rglob("*")) == [
        "holiday.jpg",
        "metrics.jsonl",
        "report",
        "report/loss.png",
    ]


def test_a_key_added_since_a_run_was_written_reads_as_its_default():
    cfg = load_config("demo_uvit")
    stored = config_to_dict(cfg)
    del stored["model"]["uvit"]["skip_linear_skip_scale_init"]  # written before the key existed
    assert config_differences(stored, config_to_dict(cfg)) == []
    stored["optim"]["lr"] = 1.0  # a real difference still shows, with the stored value
    assert config_differences(stored, config_to_dict(cfg)) == ["optim.lr: 1.0 -> 0.005"]
    # a missing key is the default, not the new config's value: the demo U-ViT turns mlp_conv on
    stored = config_to_dict(cfg)
    del stored["model"]["uvit"]["mlp_conv"]
    assert config_differences(stored, config_to_dict(cfg)) == ["model.uvit.mlp_conv: False -> True"]


def test_a_folder_run_written_before_data_heldout_resumes_on_all_its_images(tmp_path):
    """Before data.heldout a folder run trained on every image: its missing key reads 0, so the
    same command no longer resumes it on fewer images, and data.heldout=0 resumes it as it was."""
    (tmp_path / "images").mkdir()
    folder = [
        "data.name=folder",
        f"data.path={tmp_path / 'images'}",
        "data.channels=1",
        f"out_dir={tmp_path}",
    ]
    cfg = load_config("demo", folder)
    assert cfg.data.heldout == cfg.diagnostics.noise_levels > 0  # a new run holds images out
    stored = config_to_dict(cfg)
    del stored["data"]["heldout"]
    assert config_differences(stored, config_to_dict(cfg)) == [f"data.heldout: 0 -> {cfg.data.heldout}"]
    old = load_config("demo", [*folder, "data.heldout=0"])
    assert config_differences(stored, config_to_dict(old)) == []
    run = RunDir(cfg.run_dir)
    run.path.mkdir(parents=True)
    run.config_file.write_text(yaml.safe_dump(stored))
    with run.writing(), pytest.raises(ScaleLongError) as info:
        run.prepare(cfg)
    assert "written before data.heldout and trained on all its images: resume it with data.heldout=0" in str(
        info.value
    )
    digits = config_to_dict(load_config("demo"))  # a dataset with a split of its own: 0 as before
    del digits["data"]["heldout"]
    assert config_differences(digits, config_to_dict(load_config("demo"))) == []
