import math

import pytest
import torch

from scalelong.diagnostics.theory import (
    ReLUUNet,
    feature_bound_experiment,
    fit_feature_bound,
    lipschitz_sum,
    measured_coefficients,
    theory_sums,
)
from scalelong.models.uvit import UViT


def test_sums_of_the_bounds():
    assert lipschitz_sum([1.0, 0.5], 2.0) == pytest.approx(1.0 * 2 + 0.5 * 4)
    sums = theory_sums([1.0, 0.5, 0.25], m0=1.0)
    assert sums["sum_sq_from"] == pytest.approx([1.3125, 0.3125, 0.0625])
    assert sums["lipschitz_sum"] == pytest.approx(1.75)


def test_fit_recovers_an_exact_line():
    c1, c2, r2 = fit_feature_bound([1.0, 2.0, 5.0], [5.0, 7.0, 13.0])
    assert (c1, c2, r2) == pytest.approx((2.0, 3.0, 1.0))
    c1, c2, r2 = fit_feature_bound([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0])
    assert (c1, c2, r2) == pytest.approx((0.8, 0.5, 0.64))  # residuals 0.3, -0.9, 0.9, -0.3 of ss_tot 5
    assert math.isnan(fit_feature_bound([1.0, 2.0, 3.0], [4.0, 4.0, 4.0])[2])


def test_relu_unet_follows_its_recursion():
    torch.manual_seed(0)
    net = ReLUUNet(width=16, num_skips=3, method="cs", kappa=0.5)
    x = torch.randn(2, 16)
    hs, out = net.hidden(x)
    s1 = net.enc[0](x)
    s2 = net.enc[1](s1)
    s3 = net.enc[2](s2)
    h3 = 0.25 * s3 + net.mid(s3)
    h2 = 0.5 * s2 + net.dec[2](h3)
    h1 = s1 + net.dec[1](h2)
    for got, want in zip(hs, [h1, h2, h3], strict=True):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(out, net.dec[0](h1))
    torch.testing.assert_close(net(x), out)
    assert list(net.diagnostic_blocks()) == ["enc.0", "enc.1", "enc.2", "mid", "dec.2", "dec.1", "dec.0"]


def test_feature_bound_holds_on_the_theorems_network():
    fit = feature_bound_experiment("relu", depths=(4, 8, 12, 16), width=256, batch=16, repeats=4)
    print(f"ReLU UNet: c1={fit.c1:.3f} c2={fit.c2:.1f} R^2={fit.r2:.4f}")
    assert fit.r2 >= 0.9
    # At Kaiming init each block keeps ||x||^2 on average: c1 ~ 1 and c2 ~ ||x_t||^2 = width.
    assert 0.75 < fit.c1 < 1.25
    assert 0.5 * 256 < fit.c2 < 1.5 * 256
    assert len(fit.rows) == 3 * (4 + 8 + 12 + 16)


def test_uvit_feature_norms_order_by_method():
    fit = feature_bound_experiment("uvit", depths=(16,), width=64, batch=8, repeats=1)
    mean = {m: sum(r["h_sq"] for r in fit.rows if r["method"] == m) / 8 for m in ("none", "sqrt2", "cs")}
    print(f"U-ViT depth 16: mean ||h_i||^2 {mean}, bound fit R^2={fit.r2:.4f}")
    assert mean["none"] > mean["sqrt2"] > mean["cs"]
    assert math.isfinite(fit.r2) and fit.r2 <= 1.0  # reported as measured; U-ViT is not the theorem's net


def test_measured_coefficients_match_the_method():
    x, t = torch.randn(2, 1, 8, 8), torch.rand(2) * 999
    cs = UViT(8, 2, 1, 32, 6, 2, skip_method="cs", kappa=0.5)
    assert measured_coefficients(cs, x, t) == pytest.approx([1.0, 0.5, 0.25])
    assert cs.skip_scaling.probe is None
    ls = UViT(8, 2, 1, 32, 6, 2, skip_method="ls")
    assert all(0.3 < c < 0.7 for c in measured_coefficients(ls, x, t))
