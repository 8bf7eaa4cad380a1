"""Stability diagnostics: what the ScaleLong paper measures, from ``scalelong train`` or your own loop.

* :mod:`~scalelong.diagnostics.monitor`: :class:`Diagnostics`, the skip, block, fp16 and
  oscillation statistics of a model every few steps, and the names of the metrics it records;
* :mod:`~scalelong.diagnostics.blocks`: :func:`find_blocks`, the blocks whose features it records;
* :mod:`~scalelong.diagnostics.headroom`: how close a run came to fp16's largest value
  (:func:`fp16_headroom`, :func:`headroom_warning`);
* :mod:`~scalelong.diagnostics.lipschitz`: :func:`robustness`, the local Lipschitz ratio the paper bounds;
* :mod:`~scalelong.diagnostics.overflow`: the ops fp16 autocast runs in half precision, and the
  first one that overflows;
* :mod:`~scalelong.diagnostics.theory`: the paper's bounds, checked numerically;
* :mod:`~scalelong.diagnostics.metric_names`: the names of the logged metrics.

The public names of the first four are importable from the package itself, and so is
:class:`~scalelong.runlog.RunLog`, which writes the records into a folder's ``metrics.jsonl``
exactly as ``scalelong train`` does, so ``scalelong analyze FOLDER`` draws the same plots (loss,
norm of hidden features, gradient oscillation, skip coefficients) from your own run.
:func:`robustness` measures the local Lipschitz ratio the paper bounds, under this package's
schedules or a diffusers scheduler.

Your own loop, with a diffusers UNet (the same with ``UViT`` / ``UNet``)::

    import torch
    import torch.nn.functional as F
    from diffusers import DDPMScheduler, UNet2DModel

    from scalelong import Diagnostics, RunLog, apply_scalelong, robustness

    unet = UNet2DModel(
        sample_size=16, in_channels=1, out_channels=1, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8, attention_head_dim=8,
    )
    apply_scalelong(unet, method="ls")  # first: LS adds parameters the optimizer must see
    scheduler = DDPMScheduler(num_train_timesteps=1000)
    opt = torch.optim.AdamW(unet.parameters(), lr=1e-3)
    diag = Diagnostics(unet, every=2)
    with RunLog("runs/my-unet") as log:
        for step in range(1, 11):
            x0 = torch.randn(8, 1, 16, 16)  # your batch
            noise, t = torch.randn_like(x0), torch.randint(0, 1000, (8,))
            diag.arm(step)  # before the forward: installs the hooks on logged steps (returns True)
            loss = F.mse_loss(unet(scheduler.add_noise(x0, noise, t), t).sample, noise)
            loss.backward()
            record = diag.collect(step, loss.item())  # after backward, before step; {} if not logged
            log.write(step, record, loss=loss.item(), lr=opt.param_groups[0]["lr"])
            opt.step()
            opt.zero_grad()
    print(robustness(unet, scheduler, torch.randn(4, 1, 16, 16), ts=[10, 500, 990]))

and then ``scalelong analyze runs/my-unet`` writes ``runs/my-unet/report/*.png``. Under DDP
create the ``RunLog`` on the main process only (every process calls ``arm`` and ``collect``:
their gradients are the all-reduced ones).
"""

from __future__ import annotations

from scalelong.diagnostics.blocks import find_blocks
from scalelong.diagnostics.headroom import HEADROOM_WARNING, fp16_headroom, headroom_warning
from scalelong.diagnostics.lipschitz import model_output, noised, robustness
from scalelong.diagnostics.monitor import OSC_SERIES, SKIP_KEYS, Diagnostics, window_stats
from scalelong.diagnostics.overflow import FP16_MAX, OpWatch  # they lived here
from scalelong.runlog import RunLog  # re-exported: it used to live here

__all__ = [
    "FP16_MAX",
    "HEADROOM_WARNING",
    "OSC_SERIES",
    "SKIP_KEYS",
    "Diagnostics",
    "OpWatch",
    "RunLog",
    "find_blocks",
    "model_output",
    "noised",
    "window_stats",
    "robustness",
    "fp16_headroom",
    "headroom_warning",
]
