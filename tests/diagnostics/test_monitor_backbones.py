"""The diagnostics on every backbone, from the trainer and from a user's own loop.

Each backbone runs one logged training step: the record must hold a finite feature norm and
block gradient norm, exactly the expected block names in forward order, and every skip. A
diffusers UNet is probed raw (as a user applies ScaleLong to it), inside ``DiffusersUNet2D``
(as ``scalelong train`` builds it) and inside a module of the user's own.
"""

import copy
import json
import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import nn

diffusers = pytest.importorskip("diffusers")

import scalelong  # noqa: E402
from adapter_fixtures import TOY_DIFFUSERS_OVERRIDES, unet2d, unet2d_condition  # noqa: E402
from scalelong import Diagnostics, RunLog, robustness  # noqa: E402
from scalelong.adapters import apply_scalelong, remove_scalelong  # noqa: E402
from scalelong.cli import main  # noqa: E402
from scalelong.diagnostics import find_blocks  # noqa: E402
from scalelong.diffusion import DiscreteDDPM  # noqa: E402
from scalelong.errors import ScaleLongError  # noqa: E402
from scalelong.models import UNet, UViT  # noqa: E402
from scalelong.studies.divergence import divergence, feature_growth  # noqa: E402
from scalelong.training.build import DiffusersUNet2D  # noqa: E402
from scalelong.training.runs import MetricsLog, RunDir  # noqa: E402

# One worker runs this module (`--dist loadgroup`): the diffusers run is made once.
pytestmark = pytest.mark.xdist_group("test_monitor_backbones")

DIFFUSERS_BLOCKS = ["down_blocks.0", "down_blocks.1", "mid_block", "up_blocks.0", "up_blocks.1"]
UVIT_BLOCKS = ["in_blocks.0", "in_blocks.1", "mid_block", "out_blocks.0", "out_blocks.1"]
UNET_BLOCKS = [f"down.{i}" for i in range(3)] + ["mid.0", "mid.1"] + [f"up.{i}" for i in range(5)]
KAPPA = 0.8


class TextToImage(nn.Module):
    """A user's own module holding a conditional UNet and a text projection."""

    def __init__(self, unet: nn.Module):
        super().__init__()
        self.text = nn.Linear(8, 8)
        self.unet = unet

    def forward(self, x, t, context):
        return self.unet(x, t, encoder_hidden_states=self.text(context)).sample


def _cs(unet: nn.Module) -> nn.Module:
    return apply_scalelong(unet, method="cs", kappa=KAPPA)


@dataclass
class Backbone:
    build: Callable[[], nn.Module]
    predict: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]  # (model, x_t, t) -> output
    side: int
    blocks: list[str]
    skips: int


def _context(x: torch.Tensor) -> torch.Tensor:
    return torch.randn(x.shape[0], 5, 8, generator=torch.Generator().manual_seed(3))


BACKBONES = {
    "UNet2DModel": Backbone(lambda: _cs(unet2d()), lambda m, x, t: m(x, t).sample, 16, DIFFUSERS_BLOCKS, 4),
    "UNet2DModel-in-DiffusersUNet2D": Backbone(
        lambda: DiffusersUNet2D(_cs(unet2d())), lambda m, x, t: m(x, t), 16, DIFFUSERS_BLOCKS, 4
    ),
    "UNet2DConditionModel": Backbone(
        lambda: _cs(unet2d_condition()),
        lambda m, x, t: m(x, t, encoder_hidden_states=_context(x)).sample,
        16,
        DIFFUSERS_BLOCKS,
        4,
    ),
    "UNet2DConditionModel-in-a-user-module": Backbone(
        lambda: TextToImage(_cs(unet2d_condition())),
        lambda m, x, t: m(x, t, _context(x)),
        16,
        DIFFUSERS_BLOCKS,
        4,
    ),
    "UViT": Backbone(
        lambda: UViT(8, 2, 1, 32, 4, 2, skip_method="cs", kappa=KAPPA),
        lambda m, x, t: m(x, t),
        8,
        UVIT_BLOCKS,
        2,
    ),
    "UNet": Backbone(
        lambda: UNet(8, 1, 16, (1, 2), 1, (4,), dropout=0.0, norm_groups=8, skip_method="cs", kappa=KAPPA),
        lambda m, x, t: m(x, t),
        8,
        UNET_BLOCKS,
        4,
    ),
}


def logged_step(model: nn.Module, backbone: Backbone, diag: Diagnostics, step: int = 1) -> dict:
    """One step of a plain loop: arm, forward, backward, collect."""
    gen = torch.Generator().manual_seed(step)
    x = torch.randn(3, 1, backbone.side, backbone.side, generator=gen)
    t = torch.randint(0, 1000, (3,), generator=gen)
    assert diag.arm(step)
    out = backbone.predict(model, x, t)
    loss = (out - x).square().mean()
    loss.backward()
    return diag.collect(step, loss.item())


def block_keys(record: dict) -> list[str]:
    return [k.split("/")[1] for k in record if k.startswith("block/") and k.endswith("/feature_norm")]


@pytest.mark.parametrize("name", list(BACKBONES))
def test_every_backbone_records_its_blocks_in_forward_order_and_every_skip(name):
    backbone = BACKBONES[name]
    model = backbone.build().train()
    fired = []
    for block_name, block in find_blocks(model).items():
        block.register_forward_hook(lambda *_, n=block_name: fired.append(n))
    with Diagnostics(model, every=1) as diag:
        assert list(diag.blocks) == backbone.blocks
        record = logged_step(model, backbone, diag)
    assert fired == backbone.blocks  # the order the forward runs them
    assert block_keys(record) == backbone.blocks
    assert math.isfinite(record["feature_norm"]) and record["feature_norm"] > 0
    assert math.isfinite(record["block_grad_norm"]) and record["block_grad_norm"] > 0
    for block_name in backbone.blocks:
        assert record[f"block/{block_name}/feature_norm"] > 0 and record[f"block/{block_name}/grad_norm"] > 0
    assert {int(k.split("/")[1]) for k in record if k.startswith("skip/")} == set(
        range(1, backbone.skips + 1)
    )
    for i in range(1, backbone.skips + 1):
        assert record[f"skip/{i}/coef_mean"] == pytest.approx(KAPPA ** (i - 1))
        assert record[f"skip/{i}/norm_out"] == pytest.approx(KAPPA ** (i - 1) * record[f"skip/{i}/norm_in"])
    assert record["nonfinite_values"] == 0


@pytest.mark.parametrize("make", [unet2d, unet2d_condition])
def test_a_diffusers_unet_without_scalelong_still_records_its_blocks(make):
    model = make().train()
    backbone = BACKBONES[make().__class__.__name__]
    with Diagnostics(model, every=1) as diag:
        assert list(diag.blocks) == DIFFUSERS_BLOCKS and diag.scaling is None
        record = logged_step(model, backbone, diag)
    assert block_keys(record) == DIFFUSERS_BLOCKS and math.isfinite(record["feature_norm"])
    assert not any(k.startswith("skip/") for k in record)


@pytest.mark.parametrize("wrap", [False, True])
def test_an_ema_copy_watches_its_own_blocks(wrap):
    model = _cs(unet2d())
    model = DiffusersUNet2D(model) if wrap else model
    ema = copy.deepcopy(model)  # as the trainer makes its EMA model
    unet, ema_unet = (model.unet, ema.unet) if wrap else (model, ema)
    blocks = find_blocks(ema)
    assert list(blocks) == DIFFUSERS_BLOCKS
    assert blocks["mid_block"] is ema_unet.mid_block and blocks["up_blocks.1"] is ema_unet.up_blocks[1]
    assert not {id(m) for m in blocks.values()} & {id(m) for m in unet.modules()}
    backbone = BACKBONES["UNet2DModel-in-DiffusersUNet2D" if wrap else "UNet2DModel"]
    with Diagnostics(ema, every=1) as diag:
        record = logged_step(ema, backbone, diag)  # only the copy runs: its blocks must be the ones heard
    assert all(math.isfinite(record[f"block/{n}/feature_norm"]) for n in DIFFUSERS_BLOCKS)


def test_remove_scalelong_clears_the_declared_blocks():
    unet = _cs(unet2d())
    scaling = unet.scalelong
    assert list(scaling.watched_blocks) == DIFFUSERS_BLOCKS
    remove_scalelong(unet)
    assert not scaling.watched_blocks  # a kept reference holds no blocks of the model any more
    diag = Diagnostics(unet, every=1)
    assert diag.scaling is None and list(diag.blocks) == DIFFUSERS_BLOCKS  # the generic discovery
    apply_scalelong(unet, method="ls")
    assert list(unet.scalelong.watched_blocks) == DIFFUSERS_BLOCKS


def test_a_model_without_blocks_is_refused_not_silently_nan():
    with pytest.raises(ScaleLongError, match="found no blocks in Linear"):
        Diagnostics(nn.Linear(2, 2), every=1)
    assert Diagnostics(nn.Linear(2, 2), every=0).blocks == {}  # off: nothing to record


def test_the_public_names_import_lazily():
    assert {"Diagnostics", "RunLog", "robustness"} <= set(scalelong.__all__)
    assert scalelong.RunLog is RunLog and scalelong.robustness is robustness


# ---------------------------------------------------------------------- scalelong train on diffusers

TOY_DIFFUSERS = [
    *TOY_DIFFUSERS_OVERRIDES,
    "train.steps=4",
    "train.batch_size=8",
    "train.log_every=2",
    "train.tensorboard=false",
    "optim.warmup_steps=1",
    "sample.num_images=0",
    "eval.every=0",
    "diagnostics.every=2",
    "diagnostics.noise_levels=8",  # the end-of-run probe on 8 held-out images, not 256
]


@pytest.fixture(scope="module")
def diffusers_run(tmp_path_factory) -> RunDir:
    from scalelong.training.config import load_config
    from scalelong.training.train import train

    out = tmp_path_factory.mktemp("train")
    torch.manual_seed(0)
    cfg = load_config("configs/demo_uvit.yaml", [f"out_dir={out}", "name=diffusers", *TOY_DIFFUSERS])
    return RunDir(train(cfg, progress=False).run_dir)


@pytest.mark.slow
def test_train_on_a_diffusers_unet_logs_the_feature_norm_and_every_block(diffusers_run, tmp_path):
    logged = [r for r in diffusers_run.metrics() if "feature_norm" in r]
    assert [r["step"] for r in logged] == [2, 4]
    for r in logged:
        assert math.isfinite(r["feature_norm"]) and r["feature_norm"] > 0
        assert math.isfinite(r["block_grad_norm"]) and r["block_grad_norm"] > 0
        assert block_keys(r) == DIFFUSERS_BLOCKS
        assert all(math.isfinite(r[f"block/{n}/grad_norm"]) for n in DIFFUSERS_BLOCKS)
        assert all(0 < r[f"skip/{i}/coef_mean"] < 1 for i in range(1, 5))  # ls: learned, in (0, 1)
    assert main(["analyze", str(diffusers_run), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "feature_norm.png").is_file() and (tmp_path / "grad_oscillation.png").is_file()


@pytest.mark.slow
def test_a_diffusers_run_reports_its_feature_growth_beside_the_verdict(diffusers_run):
    """The failure rule reads a diffusers UNet's records as the U-ViT's; its feature growth is a
    reported number (the last norm over the first logged), never a failure by itself."""
    records = diffusers_run.metrics()
    first = next(r["feature_norm"] for r in records if "feature_norm" in r)
    blown = [dict(r) for r in records]
    blown[-1]["feature_norm"] = 1e3 * first
    assert feature_growth(blown, warmup_steps=0) == pytest.approx(1e3)
    assert [d.criterion for d in divergence(blown)] == [d.criterion for d in divergence(records)]
    blown[-1]["feature_norm"] = math.inf
    assert feature_growth(blown, warmup_steps=0) == math.inf


# ---------------------------------------------------------------------- a user's own loop


def own_loop(folder, steps: int = 4, every: int = 2) -> list[dict]:
    """A plain PyTorch loop: a diffusers UNet, DDPMScheduler, ScaleLong, Diagnostics, RunLog."""
    unet = apply_scalelong(unet2d(), method="ls")
    scheduler = diffusers.DDPMScheduler(num_train_timesteps=1000)
    opt = torch.optim.AdamW(unet.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    written = []
    with Diagnostics(unet, every=every) as diag, RunLog(folder) as log:
        for step in range(1, steps + 1):
            x0 = torch.randn(4, 1, 16, 16, generator=gen)
            noise, t = torch.randn(x0.shape, generator=gen), torch.randint(0, 1000, (4,), generator=gen)
            diag.arm(step)
            loss = torch.nn.functional.mse_loss(unet(scheduler.add_noise(x0, noise, t), t).sample, noise)
            loss.backward()
            record = diag.collect(step, loss.item())  # {} on the steps arm() did not arm
            written.append(log.write(step, record, loss=loss, lr=opt.param_groups[0]["lr"]))
            opt.step()
            opt.zero_grad()
    return written


def test_an_own_loop_folder_is_analyzed_like_a_trained_run(tmp_path, capsys):
    folder = tmp_path / "my-unet"
    written = own_loop(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["metrics.jsonl"]  # no config, no lock left
    records = RunDir(folder).metrics()
    assert json.dumps(records) == json.dumps(written) and [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(list(r)[:3] == ["step", "loss", "lr"] and r["lr"] == 1e-3 for r in records)
    assert all(math.isfinite(r["feature_norm"]) for r in records[1::2]) and "feature_norm" not in records[0]
    assert main(["analyze", str(folder)]) == 0
    out, err = capsys.readouterr()
    names = sorted(p.name for p in (folder / "report").iterdir())
    assert names == [
        "coefficients_my-unet.png",
        "feature_norm.png",
        "grad_oscillation.png",
        "loss.png",
        "magnitude.png",
    ]
    assert (folder / "report" / "feature_norm.png").read_bytes()[:4] == b"\x89PNG" and err == ""
    assert out.split() == [str(folder / "report" / n) for n in ["loss.png", "feature_norm.png"]] + [
        str(folder / "report" / n)
        for n in ["grad_oscillation.png", "magnitude.png", "coefficients_my-unet.png"]
    ]


def test_runlog_writes_the_trainers_format(tmp_path):
    with RunLog(tmp_path / "r") as log:
        log.write(
            3, {"feature_norm": math.nan, "spikes": 0, "skip/1/coef_mean": torch.tensor(0.5)}, loss=math.inf
        )
        log.write(4, {"grad_norm": None}, loss=torch.tensor(0.25), lr=1e-4)
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    assert lines[0] == json.dumps(
        {"step": 3, "loss": "inf", "feature_norm": "nan", "spikes": 0, "skip/1/coef_mean": 0.5}
    )
    # None is left out, as the trainer does
    assert json.loads(lines[1]) == {"step": 4, "loss": 0.25, "lr": 1e-4}
    read = MetricsLog(tmp_path / "r" / "metrics.jsonl").read()
    assert math.isinf(read[0]["loss"]) and math.isnan(read[0]["feature_norm"])


def test_runlog_writes_tensorboard_on_request(tmp_path):
    pytest.importorskip("torch.utils.tensorboard")
    with RunLog(tmp_path / "r", tensorboard=True) as log:
        log.write(1, {"feature_norm": 2.0}, loss=0.5)
    assert len(list((tmp_path / "r" / "tb").glob("events.out.tfevents.*"))) == 1


def test_runlog_holds_the_folder_and_refuses_what_it_cannot_write(tmp_path, capsys):
    folder = tmp_path / "r"
    log = RunLog(folder)
    assert (folder / ".lock").is_file()
    with pytest.raises(ScaleLongError, match="is being written by pid"):
        RunLog(folder)  # one writer at a time
    for bad, match in [
        (lambda: log.write(-1, loss=1.0), "step must be an integer"),
        (lambda: log.write(1, {"loss": 2.0}, loss=1.0), "loss given twice"),
        (lambda: log.write(1, {"step": 1}), "step given twice"),
        (lambda: log.write(1, {"x": torch.ones(2)}), "tensor of shape"),
        (lambda: log.write(1, {"x": [1.0]}), "log a number or a string"),
    ]:
        with pytest.raises(ScaleLongError, match=match):
            bad()
    log.write(1, loss=1.0)
    log.write(2, loss=0.5)
    log.close()
    log.close()
    assert not (folder / ".lock").exists()
    with pytest.raises(ScaleLongError, match="closed"):
        log.write(3, loss=0.1)
    with pytest.warns(UserWarning, match=r"held 1 record\(s\) after step 1"):
        again = RunLog(folder, start_step=1)  # a resumed loop: step 2 is written again
    with again:
        again.write(2, loss=0.4)
    assert capsys.readouterr().out == ""  # the library warns through warnings, never print
    assert [(r["step"], r["loss"]) for r in RunDir(folder).metrics()] == [(1, 1.0), (2, 0.4)]
    (tmp_path / "trained").mkdir()
    (tmp_path / "trained" / "config.yaml").write_text("name: x\n")
    with pytest.raises(ScaleLongError, match="holds a run of `scalelong train`"):
        RunLog(tmp_path / "trained")


def test_a_resumed_runlog_keeps_lines_without_an_integer_step_in_metrics_jsonl_bad(tmp_path):
    folder = tmp_path / "r"
    folder.mkdir()
    lines = ['{"step": 1, "loss": 1.0}', '{"step": null, "loss": 2.0}', '{"step": "abc"}', '{"step": 2}']
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.warns(UserWarning) as caught, RunLog(folder, start_step=1) as log:  # no TypeError
        log.write(2, loss=0.5)
    said = [str(w.message) for w in caught]
    assert len(said) == 2 and "held 1 record(s) after step 1" in said[0]  # step 2: dropped, as documented
    assert "line(s) 2, 3 are not JSON records" in said[1] and "moved to" in said[1] and "jsonl.bad" in said[1]
    assert (folder / "metrics.jsonl.bad").read_text() == lines[1] + "\n" + lines[2] + "\n"
    assert [(r["step"], r["loss"]) for r in RunDir(folder).metrics()] == [(1, 1.0), (2, 0.5)]


def _docstring_block(doc: str, after: str) -> str:
    """The indented code block that follows the line containing ``after``."""
    lines = doc.split(after, 1)[1].split("\n")[2:]  # skip the rest of that line and the blank one
    block = []
    for line in lines:
        if line.strip() and not line.startswith("    "):
            break
        block.append(line)
    return textwrap.dedent("\n".join(block))


@pytest.mark.parametrize(
    "where, after, folder",
    [("module", "Your own loop", "runs/my-unet"), ("class", "With the package's U-ViT", "runs/my-uvit")],
)
def test_the_documented_loops_run_and_analyze(where, after, folder, tmp_path, monkeypatch, capsys):
    import scalelong.diagnostics as module

    doc = module.__doc__ if where == "module" else module.Diagnostics.__doc__
    monkeypatch.chdir(tmp_path)
    exec(compile(_docstring_block(doc, after), f"{where} docstring", "exec"), {})
    assert main(["analyze", folder]) == 0
    assert (tmp_path / folder / "report" / "feature_norm.png").is_file()
    assert "error" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "content, why",
    [
        (None, "holds no metrics.jsonl"),
        ("", "metrics.jsonl is empty"),
        ("\x00\x9fgarbage\nnot json either\n[1, 2]\n", "holds no record"),
        ('{"loss": 0.5}\n{"step": "one", "loss": 0.5}\n', "holds no record"),
        ('{"step": 1, "loss": "nan"}\n{"step": 2, "feature_norm": "inf"}\n', "hold no finite number"),
        ('{"step": 1, "img_per_s": 30.0}\n{"step": 2, "note": 1}\n', "hold no loss, feature_norm"),
    ],
)
def test_analyze_says_when_there_is_nothing_to_plot(content, why, tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    if content is not None:
        (folder / "metrics.jsonl").write_bytes(content.encode("utf-8", "surrogateescape"))
    assert main(["analyze", str(folder)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert err.startswith("error: nothing to plot: ") and why in err
    assert sorted(p.name for p in folder.iterdir()) == ([] if content is None else ["metrics.jsonl"])


def test_analyze_of_a_missing_folder_or_a_metrics_file(tmp_path, capsys):
    assert main(["analyze", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: nothing to plot: ") and "nowhere does not exist" in err
    assert not (tmp_path / "nowhere").exists()
    folder = tmp_path / "run"
    with RunLog(folder) as log:
        log.write(1, loss=1.0)
        log.write(2, loss=0.5)
    assert main(["analyze", str(folder / "metrics.jsonl")]) == 0  # the file itself: plots beside it
    assert (folder / "report" / "loss.png").is_file()


# ---------------------------------------------------------------------- robustness on diffusers


def test_robustness_of_a_diffusers_unet_under_ddpmscheduler():
    unet = unet2d()
    scheduler = diffusers.DDPMScheduler(num_train_timesteps=1000)
    x0 = torch.randn(2, 1, 16, 16, generator=torch.Generator().manual_seed(0))

    def probe(model, schedule=scheduler):
        return robustness(model, schedule, x0, [10, 500, 990], 1e-2, torch.Generator().manual_seed(1))

    plain = probe(unet)
    assert [r["t"] for r in plain] == [10, 500, 990]
    assert all(0 < r["mean"] <= r["max"] < math.inf for r in plain)
    # the same chain as the package's discrete DDPM (linear betas 1e-4 .. 0.02): the same numbers
    same = probe(unet, DiscreteDDPM())
    for a, b in zip(plain, same, strict=True):
        assert a["mean"] == pytest.approx(b["mean"], rel=1e-3)
    apply_scalelong(unet, method="cs", kappa=0.3)  # damped skips: another map, another ratio
    scaled = probe(unet)
    assert all(abs(a["mean"] - b["mean"]) > 1e-3 * a["mean"] for a, b in zip(plain, scaled, strict=True))


def test_robustness_of_a_conditional_unet_and_of_tuple_outputs():
    unet = _cs(unet2d_condition())
    text = torch.randn(2, 5, 8)
    rows = robustness(
        unet, diffusers.DDPMScheduler(), torch.randn(2, 1, 16, 16), [100], encoder_hidden_states=text
    )
    assert math.isfinite(rows[0]["mean"]) and rows[0]["mean"] > 0

    class Tripler(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.tensor(3.0))

        def forward(self, x, t):
            return (self.w * x, t)

    rows = robustness(Tripler(), diffusers.DDPMScheduler(), torch.randn(2, 1, 4, 4), [0, 999], 1e-2)
    assert [r["mean"] for r in rows] == pytest.approx([3.0, 3.0], rel=1e-4)


def test_robustness_refuses_what_it_cannot_probe():
    model, x0 = unet2d(), torch.randn(1, 1, 16, 16)
    with pytest.raises(ScaleLongError, match="integer timesteps in 0..999"):
        robustness(model, diffusers.DDPMScheduler(), x0, [0.5])
    with pytest.raises(ScaleLongError, match="integer timesteps in 0..999"):
        robustness(model, diffusers.DDPMScheduler(), x0, [1000])
    with pytest.raises(ScaleLongError, match="got dict"):
        robustness(model, {"betas": 1}, x0, [1])

    class Dict(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.tensor(1.0))

        def forward(self, x, t):
            return {"out": self.w * x}

    with pytest.raises(ScaleLongError, match="returned a dict"):
        robustness(Dict(), diffusers.DDPMScheduler(), x0, [1])
