import math

import pytest
import torch
from torch import nn

from scalelong.diagnostics import Diagnostics, find_blocks, robustness, window_stats
from scalelong.diffusion import VPSDE, training_loss
from scalelong.errors import ScaleLongError
from scalelong.models.uvit import UViT
from scalelong.training.checkpoint import save_checkpoint
from scalelong.training.config import Config, config_to_dict
from scalelong.training.runs import checkpoint_robustness

N_SKIPS = 3
BLOCKS = [
    "in_blocks.0",
    "in_blocks.1",
    "in_blocks.2",
    "mid_block",
    "out_blocks.0",
    "out_blocks.1",
    "out_blocks.2",
]


def tiny_uvit(method: str = "none", kappa: float = 0.5) -> UViT:
    return UViT(8, 2, 1, 32, 2 * N_SKIPS, 2, skip_method=method, kappa=kappa)


def train_steps(model: nn.Module, diag: Diagnostics, steps: range) -> dict[int, dict[str, float]]:
    """The protocol: arm before the forward, collect after backward, on every step."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    records = {}
    for step in steps:
        diag.arm(step)
        loss = training_loss(model, VPSDE(), torch.randn(4, 1, 8, 8, generator=gen), gen).mean()
        loss.backward()
        record = diag.collect(step, loss.item())
        if record:
            records[step] = record
        opt.step()
        opt.zero_grad()
    return records


def skip_indices(record: dict) -> set[int]:
    return {int(k.split("/")[1]) for k in record if k.startswith("skip/")}


def test_block_discovery_falls_back_to_module_lists_and_mid_block():
    assert list(find_blocks(tiny_uvit())) == BLOCKS


def test_cs_records_one_entry_per_skip_with_kappa_powers():
    model = tiny_uvit("cs", kappa=0.5)
    with Diagnostics(model, every=2) as diag:
        records = train_steps(model, diag, range(1, 7))
    assert sorted(records) == [2, 4, 6]
    for rec in records.values():
        assert skip_indices(rec) == {1, 2, 3}
        for i in range(1, N_SKIPS + 1):
            expected = 0.5 ** (i - 1)  # skip 1 is the outermost and keeps 1
            assert rec[f"skip/{i}/coef_mean"] == pytest.approx(expected)
            assert rec[f"skip/{i}/coef_min"] == rec[f"skip/{i}/coef_max"] == pytest.approx(expected)
            assert rec[f"skip/{i}/norm_out"] == pytest.approx(expected * rec[f"skip/{i}/norm_in"], rel=1e-5)
            assert rec[f"skip/{i}/norm_in"] > 0
        for name in BLOCKS:
            assert rec[f"block/{name}/feature_norm"] > 0
            assert rec[f"block/{name}/grad_norm"] > 0
        assert rec["nonfinite_values"] == 0 and rec["spikes"] == 0
    # Window statistics need two values: NaN on the first logged step, numbers afterwards.
    assert math.isnan(records[2]["osc/loss_std"])
    assert records[6]["osc/feature_norm_range"] >= 0 and records[6]["osc/loss_peak_ratio"] >= 1


def test_ls_coefficients_spread_over_the_batch():
    model = tiny_uvit("ls")
    with Diagnostics(model, every=1) as diag:
        rec = train_steps(model, diag, range(1, 2))[1]
    assert skip_indices(rec) == {1, 2, 3}
    for i in range(1, N_SKIPS + 1):
        lo, mean, hi = (rec[f"skip/{i}/coef_{k}"] for k in ("min", "mean", "max"))
        assert 0 < lo < mean < hi < 1


class CountingDiagnostics(Diagnostics):
    calls = 0

    def _probe(self, *args):
        CountingDiagnostics.calls += 1
        super()._probe(*args)

    def _feature_hook(self, name):
        inner = super()._feature_hook(name)

        def hook(*args):
            CountingDiagnostics.calls += 1
            inner(*args)

        return hook


@pytest.mark.parametrize("every", [3, 0])
def test_unlogged_steps_run_no_hook(every):
    model = tiny_uvit("cs")
    diag = CountingDiagnostics(model, every=every)  # listening from construction: no attach()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    calls_per_step, logged = {}, []
    for step in range(1, 7):
        CountingDiagnostics.calls = 0
        diag.arm(step)
        training_loss(model, VPSDE(), torch.randn(2, 1, 8, 8)).mean().backward()
        if diag.collect(step, 1.0):
            logged.append(step)
        opt.step()
        opt.zero_grad()
        calls_per_step[step] = CountingDiagnostics.calls
    expected = {s: (N_SKIPS + len(BLOCKS) if every and s % 3 == 0 else 0) for s in range(1, 7)}
    assert calls_per_step == expected and logged == ([3, 6] if every else [])
    diag.detach()
    assert model.skip_scaling.probe is None
    assert all(not m._forward_hooks for m in model.modules())


def test_nonfinite_values_are_recorded_and_counted():
    model = tiny_uvit()
    with torch.no_grad():
        model.out_blocks[0].mlp.fc2.weight[0, 0] = math.nan
    with Diagnostics(model, every=1) as diag:
        rec = train_steps(model, diag, range(1, 2))[1]
    assert math.isnan(rec["block/out_blocks.0/feature_norm"])
    assert math.isfinite(rec["block/in_blocks.0/feature_norm"])
    # feature and grad norm of the poisoned block and everything after it, and the NaN loss
    assert rec["nonfinite_values"] >= 6 and rec["nonfinite_values_total"] == rec["nonfinite_values"]
    assert rec["spikes"] == 1  # a non-finite loss is a spike


def test_spike_counter_and_window_stats():
    diag = Diagnostics(tiny_uvit(), every=1, window=4, spike_factor=3.0)
    spikes, nonfinite = [], []
    for step, loss in enumerate([1.0, 1.2, 0.8, 5.0, 1.0, 2.9, math.inf], start=1):
        assert diag.arm(step)
        rec = diag.collect(step, loss)  # no forward ran: the skips and blocks are missing, not non-finite
        spikes.append(rec["spikes"])
        nonfinite.append(rec["nonfinite_values"])
    assert spikes == [0, 0, 0, 1, 1, 1, 2]
    assert nonfinite == [0, 0, 0, 0, 0, 0, 1]
    assert math.isnan(rec["skip/1/norm_in"])
    assert window_stats([1.0, 2.0, 3.0, 10.0, math.nan]) == pytest.approx(
        {"std": math.sqrt(12.5), "range": 9.0, "peak_ratio": 4.0}
    )


# ----------------------------------------------------------------------------- misuse is never silent


def test_it_listens_from_construction_without_attach():
    model = tiny_uvit("cs")
    records = train_steps(model, Diagnostics(model, every=2), range(1, 3))
    assert list(records) == [2] and records[2]["skip/1/norm_in"] > 0 and records[2]["feature_norm"] > 0


def test_collect_on_an_unarmed_step_is_empty_and_leaves_the_windows_alone():
    model = tiny_uvit("cs")
    diag = Diagnostics(model, every=2)
    train_steps(model, diag, range(1, 3))  # step 2 logged
    before = diag.state_dict()
    assert not diag.arm(3)
    training_loss(model, VPSDE(), torch.randn(2, 1, 8, 8)).mean().backward()
    assert diag.collect(3, 100.0) == {}  # was: one NaN per key, and the loss fed the windows
    assert diag.collect(3, math.nan) == {} and diag.state_dict() == before
    fresh = Diagnostics(tiny_uvit(), every=2)
    assert fresh.collect(1, 1.0) == {} and fresh.state_dict()["history"]["loss"] == []  # never armed


def test_collect_must_match_the_armed_step():
    diag = Diagnostics(tiny_uvit(), every=2)
    assert diag.arm(4)
    with pytest.raises(ScaleLongError, match=r"collect\(step=5\) but arm\(4\) armed"):
        diag.collect(5, 1.0)


def test_an_armed_step_left_uncollected_warns_at_the_next_arm():
    diag = Diagnostics(tiny_uvit(), every=2)
    assert diag.arm(2)
    with pytest.warns(UserWarning, match="step 2 was armed but not collected"):
        diag.arm(3)
    assert diag.collect(3, 1.0) == {}


def test_arming_after_detach_is_an_error_until_attached_again():
    model = tiny_uvit("cs")
    diag = Diagnostics(model, every=1)
    diag.detach()
    with pytest.raises(ScaleLongError, match="detached; call attach"):
        diag.arm(1)
    assert model.skip_scaling.probe is None
    assert diag.attach().arm(1)
    with Diagnostics(tiny_uvit(), every=1) as diag:  # the context manager detaches at its end
        assert diag.arm(1)
    with pytest.raises(ScaleLongError, match="detached"):
        diag.arm(2)


def test_active_for_is_a_deprecated_name_of_arm():
    diag = Diagnostics(tiny_uvit(), every=2)
    with pytest.warns(DeprecationWarning, match="now Diagnostics.arm"):
        assert diag.active_for(2)
    assert diag.collect(2, 1.0)["spikes"] == 0
    with pytest.warns(DeprecationWarning):
        assert not diag.active_for(3)


class Doubler(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(2.0))

    def forward(self, x, t):
        return self.w * x + torch.sin(t)[:, None, None, None]  # a bounded offset: float32 cancels well


def test_robustness_of_a_linear_map_is_its_gain():
    rows = robustness(
        Doubler(), VPSDE(), torch.randn(4, 1, 8, 8), [0.1, 0.9], 1e-2, torch.Generator().manual_seed(0)
    )
    assert [r["t"] for r in rows] == [0.1, 0.9]
    for r in rows:
        assert r["mean"] == pytest.approx(2.0, rel=1e-4) and r["max"] == pytest.approx(2.0, rel=1e-4)


def test_robustness_of_a_checkpoint_matches_the_model(tmp_path):
    cfg = Config()
    u = cfg.model.uvit
    u.img_size, u.patch_size, u.in_channels, u.embed_dim, u.depth, u.num_heads = 8, 2, 1, 32, 4, 2
    model = UViT(**vars(u))
    ckpt = save_checkpoint(tmp_path, 1, model, model, config_to_dict(cfg))
    x0 = torch.randn(2, 1, 8, 8)
    direct = robustness(model, VPSDE(), x0, [0.5], 1e-3, torch.Generator().manual_seed(1))
    loaded = checkpoint_robustness(
        ckpt, VPSDE(), x0, [0.5], delta_scale=1e-3, generator=torch.Generator().manual_seed(1)
    )
    assert loaded[0]["mean"] == pytest.approx(direct[0]["mean"], rel=1e-5)
    assert 0 < direct[0]["mean"] < math.inf
    with pytest.raises(ScaleLongError, match="checkpoint_robustness"):  # the library takes a model only
        robustness(ckpt, VPSDE(), x0, [0.5])


def test_a_foreign_probe_is_not_overwritten():
    model = tiny_uvit()
    model.skip_scaling.probe = lambda *args: None
    with pytest.raises(ScaleLongError, match="another probe"):
        Diagnostics(model)


# ----------------------------------------------------------------------------- under a loss scaler


def scaler_steps(scaled: bool, steps: int = 3) -> dict[int, dict[str, float]]:
    """Three logged SGD steps of a tiny U-ViT on the same batches: a plain backward, or fp16's
    recipe with a GradScaler whose scale doubles every step (65536, 131072, 262144), the scale
    handed to collect. Scaling by a power of 2 is exact, so both runs take the same steps."""
    torch.manual_seed(0)
    model = tiny_uvit("cs")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=1) if scaled else None
    gen = torch.Generator().manual_seed(0)
    records = {}
    with Diagnostics(model, every=1) as diag:
        for step in range(1, steps + 1):
            diag.arm(step)
            loss = training_loss(model, VPSDE(), torch.randn(4, 1, 8, 8, generator=gen), gen).mean()
            if scaler is None:
                loss.backward()
                records[step] = diag.collect(step, loss.item())
                opt.step()
            else:
                scaler.scale(loss).backward()
                records[step] = diag.collect(step, loss.item(), grad_scale=scaler.get_scale())
                records[step]["scale"] = scaler.get_scale()
                scaler.step(opt)
                scaler.update()
            opt.zero_grad()
    return records


def test_grad_scale_gives_the_gradient_norms_of_a_plain_backward():
    plain, scaled = scaler_steps(scaled=False), scaler_steps(scaled=True)
    assert [scaled[s]["scale"] for s in (1, 2, 3)] == [2.0**16, 2.0**17, 2.0**18]  # the scaler changed it
    for step in (1, 2, 3):
        for name in BLOCKS:
            key = f"block/{name}/grad_norm"
            assert scaled[step][key] == pytest.approx(plain[step][key], rel=1e-5)  # was: x 65536 on step 1
        assert scaled[step]["block_grad_norm"] == pytest.approx(plain[step]["block_grad_norm"], rel=1e-5)
        assert scaled[step]["feature_norm"] == pytest.approx(plain[step]["feature_norm"], rel=1e-5)
        # fp16/headroom_grad is of the gradients fp16 holds in backward: the scaled ones, not divided
        assert scaled[step]["fp16/headroom_grad"] == pytest.approx(
            plain[step]["fp16/headroom_grad"] / scaled[step]["scale"], rel=1e-5
        )
    # No fake oscillation when the scale doubles: the windows hold the true norms.
    for stat in ("std", "range", "peak_ratio"):
        key = f"osc/block_grad_norm_{stat}"
        assert scaled[3][key] == pytest.approx(plain[3][key], rel=1e-4)


@pytest.mark.parametrize("scale", [0.0, -1.0, math.nan, math.inf])
def test_grad_scale_must_be_finite_and_positive(scale):
    diag = Diagnostics(tiny_uvit(), every=1)
    assert diag.arm(1)
    with pytest.raises(ScaleLongError, match=r"grad_scale=.*finite and positive"):
        diag.collect(1, 1.0, grad_scale=scale)
