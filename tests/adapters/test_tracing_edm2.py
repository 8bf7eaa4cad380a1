"""find_skips on EDM2's own UNet (Karras et al. 2024, NVlabs/edm2 ``training/networks_edm2.py``).

The suite carries no copy of EDM2's code: this check runs where a checkout of the repository is
named by ``EDM2_PATH`` (``git clone https://github.com/NVlabs/edm2``; ``EDM2_PATH=edm2 pytest
tests/adapters/test_tracing_edm2.py``) and is skipped otherwise. Every expectation comes from probes of
the test's own on the real network: forward hooks on the encoder's blocks (what each skip is),
pre-hooks on the decoder blocks that receive ``mp_cat(x, skips.pop())`` (where it enters).
"""

import os
import sys

import pytest
import torch

from scalelong import SkipInput, apply_scalelong, find_skips

EDM2 = os.environ.get("EDM2_PATH", "")
pytestmark = pytest.mark.skipif(
    not os.path.isfile(os.path.join(EDM2, "training", "networks_edm2.py")),
    reason="set EDM2_PATH to a checkout of NVlabs/edm2 to check find_skips on its UNet",
)


def edm2_unet():
    sys.path.insert(0, EDM2)
    from training.networks_edm2 import UNet

    torch.manual_seed(0)
    net = UNet(
        img_resolution=16,
        img_channels=3,
        label_dim=0,
        model_channels=16,
        channel_mult=[1, 2, 2],
        num_blocks=2,
        attn_resolutions=[8],
    )
    net.out_gain.data.fill_(1.0)  # 0 at EDM2's init, which would hide every difference in the output
    return net.eval()


def probed(net, args):
    """(what each encoder block makes, in order; (name, input) of each merging decoder block, in order)."""
    made, merged = [], []
    hooks = [b.register_forward_hook(lambda _m, _i, out: made.append(out)) for b in net.enc.values()]
    hooks += [
        b.register_forward_pre_hook(lambda _m, i, n=n: merged.append((n, i[0])))
        for n, b in net.dec.items()
        if "block" in n
    ]
    with torch.no_grad():
        net(*args)
    for h in hooks:
        h.remove()
    return made, merged


def test_find_skips_reads_every_skip_of_edm2s_unet_where_the_decoder_receives_it():
    net = edm2_unet()
    args = (torch.randn(2, 3, 16, 16), torch.rand(2), None)
    found = find_skips(net, *args)
    made, merged = probed(net, args)
    assert len(found) == len(made) == len(merged) == 9  # the encoder's 9 outputs, each merged once
    # outermost first: made first, merged last
    assert found.paths == [f"dec.{name}" for name, _ in reversed(merged)]
    for k, skip in enumerate(found):
        _, received = merged[-1 - k]
        part = received[:, skip.channels]
        # mp_cat scales each operand by one positive factor: the slice is the skip, up to it
        ratio = part / made[k]
        assert part.shape == made[k].shape and skip.arg == 0
        assert (
            torch.allclose(ratio, ratio.flatten()[0].expand_as(ratio), rtol=1e-4) and ratio.flatten()[0] > 0
        )
    # applied from the example, ScaleLong acts as the hand declaration does, and changes the output
    hand = [SkipInput(f"dec.{n}", 0, slice(-made[-1 - i].shape[1], None)) for i, (n, _) in enumerate(merged)]
    by_example, by_hand, plain = edm2_unet(), edm2_unet(), edm2_unet()
    apply_scalelong(by_example, "cs", 0.7, example=args)
    apply_scalelong(by_hand, "cs", 0.7, skips=hand[::-1])
    with torch.no_grad():
        y, y_hand, y_plain = by_example(*args), by_hand(*args), plain(*args)
    assert torch.equal(y, y_hand) and (y - y_plain).abs().max() > 1e-3
