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
