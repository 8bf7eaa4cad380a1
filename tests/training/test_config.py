"""The run configuration (:mod:`scalelong.training.config`): what it accepts and how it refuses the
rest, one ``ScaleLongError`` naming the key, before anything is built; and that the names it
accepts are the library's own.

A refusal through a whole command (one line on stderr, exit 2, nothing written) is tested with the
command: tests/cli/test_cli_training.py, tests/product/test_bad_inputs.py. Keys that only a model
reads are validated beside the model's build (tests/models/).
"""

import pytest

from scalelong.diffusion import PREDICTIONS
from scalelong.diffusion import TIME_SAMPLINGS as SCHEDULE_TIME_SAMPLINGS
from scalelong.errors import ScaleLongError
from scalelong.sampling import SAMPLERS
from scalelong.training.config import PREDICTION_NAMES, SAMPLER_NAMES, TIME_SAMPLINGS, load_config
from scalelong.training.train import micro_batch_size


def test_config_names_the_prediction_and_time_sampling():
    assert PREDICTION_NAMES == PREDICTIONS and TIME_SAMPLINGS == SCHEDULE_TIME_SAMPLINGS
    assert load_config(None, ["diffusion.prediction=x0"]).diffusion.prediction == "x0"
    with pytest.raises(
        ScaleLongError, match="diffusion.prediction='x1' is not supported; choose one of eps, v, x0, edm"
    ):
        load_config(None, ["diffusion.prediction=x1"])
    with pytest.raises(ScaleLongError, match="diffusion.time_sampling"):
        load_config(None, ["diffusion.time_sampling=beta"])
    with pytest.raises(ScaleLongError, match="needs diffusion.schedule=vpsde"):
        load_config(None, ["diffusion.schedule=ddpm", "diffusion.time_sampling=logsnr_normal"])
    with pytest.raises(ScaleLongError, match="logsnr_std must be > 0"):
        load_config(None, ["diffusion.logsnr_std=0"])


def test_config_names_the_loss_weighting():
    cfg = load_config(None, ["diffusion.loss_weighting=min_snr", "diffusion.min_snr_gamma=3"])
    assert cfg.diffusion.loss_weighting == "min_snr" and cfg.diffusion.min_snr_gamma == 3.0
    with pytest.raises(ScaleLongError, match="diffusion.loss_weighting"):
        load_config(None, ["diffusion.loss_weighting=p2"])
    with pytest.raises(ScaleLongError, match="diffusion.min_snr_gamma"):
        load_config(None, ["diffusion.min_snr_gamma=0"])


def test_grad_accum_must_divide_the_batch():
    with pytest.raises(ScaleLongError, match=r"^train.batch_size=32 must be divisible by train.grad_accum=3"):
        load_config("configs/demo_uvit.yaml", ["train.grad_accum=3"])
    with pytest.raises(ScaleLongError, match="train.grad_accum must be > 0"):
        load_config("configs/demo_uvit.yaml", ["train.grad_accum=0"])
    assert micro_batch_size(1024, 8, 4) == 32
    with pytest.raises(ScaleLongError, match=r"^train.batch_size=32 must be divisible by 3 process\(es\) x "):
        micro_batch_size(32, 3, 2)


def test_fast_path_keys_are_validated_at_the_edge():
    with pytest.raises(
        ScaleLongError,
        match=r"optim.implementation='fast' is not supported; choose one of default, foreach, fused",
    ):
        load_config("configs/demo_uvit.yaml", ["optim.implementation=fast"])
    with pytest.raises(
        ScaleLongError, match=r"eval.mixed_precision='fp8' is not supported; choose one of no, fp16, bf16"
    ):
        load_config("configs/demo_uvit.yaml", ["eval.mixed_precision=fp8"])
    assert load_config("configs/demo_uvit.yaml", ["eval.mixed_precision=no"]).eval.mixed_precision == "no"
    assert load_config("configs/demo_uvit.yaml", ["eval.mixed_precision=fp16"]).eval.mixed_precision == "fp16"


def test_eval_config_validation() -> None:
    with pytest.raises(ScaleLongError, match="eval.fid_stats"):
        load_config(None, ["eval.metric=fid", "eval.every=100"])
    with pytest.raises(ScaleLongError, match="eval.sampler"):
        load_config(None, ["eval.sampler=heun"])
    with pytest.raises(ScaleLongError, match="eval.metric"):
        load_config(None, ["eval.metric=is"])


def test_the_config_knows_every_sampler_by_name() -> None:
    assert tuple(SAMPLERS) == SAMPLER_NAMES


def test_seeds_lie_below_2_to_the_31() -> None:
    """torch refuses seeds from 2**64 on, and the evaluation's seeds (train.seed * 1_000_003 + i) and the
    sample grid's (train.seed * 100_003 + i) overflow there long before: a seed is refused up front."""
    assert load_config(None, [f"train.seed={2**31 - 1}"]).train.seed == 2**31 - 1
    for seed in (2**31, 10**13, 10**20, -1):
        with pytest.raises(ScaleLongError, match=rf"^train.seed={seed} is out of range: .*\[0, 2147483647\]"):
            load_config(None, [f"train.seed={seed}"])
    folder = ["data.name=folder", "data.path=images", "data.channels=1", "model.uvit.in_channels=1"]
    with pytest.raises(ScaleLongError, match=r"^data.heldout_seed=2147483648 is out of range"):
        load_config(None, [*folder, f"data.heldout_seed={2**31}"])


@pytest.mark.parametrize(
    "override, words",
    [
        ("diffusion.num_steps=-5", r"diffusion.num_steps=-5 must lie in \[2, 1,000,000\]"),
        ("diffusion.num_steps=0", r"diffusion.num_steps=0 must lie in \[2, "),
        ("diffusion.num_steps=1", r"diffusion.num_steps=1 must lie in \[2, "),
        ("diffusion.num_steps=10000000000", r"diffusion.num_steps=10000000000 must lie in \[2, "),
        (
            "diffusion.beta_start=-1",
            r"diffusion.beta_start=-1 and beta_end=0.02 must satisfy 0 < beta_start < beta_end",
        ),
        ("diffusion.beta_start=0", r"diffusion.beta_start=0 and beta_end=0.02 must satisfy 0 < beta_start"),
        ("diffusion.beta_end=2", r"diffusion.beta_start=0.0001 and beta_end=2 must satisfy .* < 1 "),
        ("diffusion.beta_start=0.03", r"diffusion.beta_start=0.03 and beta_end=0.02 must satisfy"),
    ],
)
def test_the_ddpm_chain_is_checked_before_anything_runs(override, words) -> None:
    """num_steps 0 crashed at the first training step (after --overwrite had removed the old run), a beta
    outside (0, 1) gave NaN noise levels: both schedules of the chain (linear, scaled_linear) refuse them."""
    ddpm = ["diffusion.schedule=ddpm", "diffusion.time_sampling=uniform"]
    for beta_schedule in ("linear", "scaled_linear"):
        with pytest.raises(ScaleLongError, match=rf"^{words}"):
            load_config(None, [*ddpm, f"diffusion.beta_schedule={beta_schedule}", override])
    # vpsde reads none of the chain's keys, and the shipped ddpm configs pass
    assert load_config(None, [override]).diffusion.schedule == "vpsde"
    for preset in ("configs/cifar10_unet_ddpm.yaml", "configs/mscoco_uvit_s2_t2i.yaml"):
        assert load_config(preset).diffusion.schedule == "ddpm"


def test_uvit_conditioning_sizes_are_checked() -> None:
    for override, words in [
        ("model.uvit.num_classes=-3", "model.uvit.num_classes must be >= 0, got -3"),
        ("model.uvit.context_dim=-1", "model.uvit.context_dim must be >= 0, got -1"),
        ("model.uvit.context_tokens=0", "model.uvit.context_tokens must be > 0, got 0"),
        ("model.uvit.context_tokens=-1", "model.uvit.context_tokens must be > 0, got -1"),
    ]:
        with pytest.raises(ScaleLongError, match=f"^{words}$"):
            load_config("configs/demo_uvit.yaml", ["model.uvit.context_dim=8", override])
    # context_tokens is read only with context_dim > 0
    assert load_config("configs/demo_uvit.yaml", ["model.uvit.context_tokens=0"]).model.uvit.context_dim == 0
