"""Fréchet distance, reference statistics, FID through a randomly initialised Inception, FD-MNIST."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import linalg

from scalelong.data import embedded_mnist
from scalelong.errors import ScaleLongError
from scalelong.metrics.fd_mnist import accuracy, shipped_classifier
from scalelong.metrics.frechet import (
    fd_of_images,
    feature_stats,
    frechet_distance,
    inception_features,
    load_inception,
    load_stats,
    mnist_reference_stats,
    reference_stats,
    save_stats,
    stored_metric,
    stored_resolution,
)


def _random_gaussian(rng: np.random.Generator, d: int) -> tuple[np.ndarray, np.ndarray]:
    a = rng.normal(size=(d, d))
    return rng.normal(size=d), a @ a.T / d + 0.1 * np.eye(d)


def test_frechet_distance_zero_on_itself_and_symmetric() -> None:
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(300, 16)) @ rng.normal(size=(16, 16))
    mu, sigma = feature_stats(feats)
    assert frechet_distance(mu, sigma, mu, sigma) == pytest.approx(0.0, abs=1e-8)
    (m1, s1), (m2, s2) = _random_gaussian(rng, 16), _random_gaussian(rng, 16)
    d12, d21 = frechet_distance(m1, s1, m2, s2), frechet_distance(m2, s2, m1, s1)
    assert d12 > 1.0 and d12 == pytest.approx(d21, rel=1e-9)
    # agrees with the textbook formula through scipy's sqrtm of the (non-symmetric) product
    ref = ((m1 - m2) ** 2).sum() + np.trace(s1 + s2 - 2 * linalg.sqrtm(s1 @ s2).real)
    assert d12 == pytest.approx(ref, rel=1e-8)


def test_frechet_distance_closed_form() -> None:
    """Covariances with a common eigenbasis: FD = |mu1 - mu2|^2 + sum (sqrt(a_i) - sqrt(b_i))^2."""
    rng = np.random.default_rng(1)
    q, _ = np.linalg.qr(rng.normal(size=(5, 5)))
    a, b = np.array([1.0, 2.0, 0.5, 4.0, 9.0]), np.array([4.0, 2.0, 2.0, 1.0, 1.0])
    mu1, mu2 = np.array([0.0, 1.0, 2.0, 3.0, 4.0]), np.array([1.0, 1.0, 0.0, 3.0, 2.0])
    expected = 9.0 + ((np.sqrt(a) - np.sqrt(b)) ** 2).sum()  # 1 + 4 + 4 = 9
    assert frechet_distance(mu1, q @ np.diag(a) @ q.T, mu2, q @ np.diag(b) @ q.T) == pytest.approx(expected)
    # one dimension: (m1 - m2)^2 + (s1 - s2)^2
    assert frechet_distance(np.array([0.5]), np.array([[4.0]]), np.array([-0.5]), np.array([[1.0]])) == (
        pytest.approx(2.0)
    )


def test_stats_round_trip_and_user_errors(tmp_path) -> None:
    a = np.random.default_rng(0).normal(size=(3, 3))
    mu, sigma = np.arange(3.0), a @ a.T  # a full covariance: every entry is checked
    path = save_stats(tmp_path / "ref.npz", mu, sigma, "fd-mnist", 10)
    got_mu, got_sigma = load_stats(path, "fd-mnist")
    np.testing.assert_array_equal(got_mu, mu)
    np.testing.assert_array_equal(got_sigma, sigma)
    with pytest.raises(ScaleLongError, match="not found"):
        load_stats(tmp_path / "missing.npz")
    with pytest.raises(ScaleLongError, match="holds fd-mnist statistics"):
        load_stats(path, "fid")
    (tmp_path / "bad.npz").write_text("not a zip")
    with pytest.raises(ScaleLongError, match="not a statistics file"):
        load_stats(tmp_path / "bad.npz")
    with pytest.raises(ScaleLongError, match="do not match"):
        frechet_distance(mu, sigma, np.zeros(4), np.eye(4))
    with pytest.raises(ScaleLongError, match="cannot write the statistics"):
        save_stats(path / "below.npz", mu, sigma, "fd-mnist", 10)  # a path through a file
    assert save_stats(tmp_path / "plain", mu, sigma, "fd-mnist", 10) == tmp_path / "plain.npz"
    np.savez(tmp_path / "nan.npz", mu=np.array([0.0, np.nan, 1.0]), sigma=sigma)
    with pytest.raises(ScaleLongError, match="NaN or infinite statistics"):
        load_stats(tmp_path / "nan.npz")
    np.savez(tmp_path / "shape.npz", mu=mu, sigma=np.eye(4))
    with pytest.raises(ScaleLongError, match=r"expected \(D,\) and \(D, D\)"):
        load_stats(tmp_path / "shape.npz")


def test_a_damaged_statistics_file_is_one_line_error(tmp_path) -> None:
    path = save_stats(tmp_path / "ref.npz", np.arange(3.0), np.eye(3), "fd-mnist", 10, resolution=32)
    data = path.read_bytes()
    flipped = bytearray(data)
    flipped[data.index(np.eye(3).tobytes()) + 5] ^= 0xFF  # in sigma's bytes: the zip's CRC catches it
    cases = [("empty", b"", 3), ("cut", data[: len(data) // 2], 3), ("flipped", bytes(flipped), 1)]
    for name, content, readers in cases:  # a changed sigma shows only where sigma is read
        bad = tmp_path / f"{name}.npz"
        bad.write_bytes(content)
        for read in (load_stats, stored_metric, stored_resolution)[:readers]:
            with pytest.raises(ScaleLongError, match="make them again with `scalelong fid-stats`") as e:
                read(bad)
            message = str(e.value)
            assert message.startswith(f"reference statistics {bad} are damaged") and "\n" not in message
    np.save(tmp_path / "bare.npy", np.arange(3.0))  # an array, not an archive of statistics
    assert stored_metric(tmp_path / "bare.npy") is None
    with pytest.raises(ScaleLongError, match="not a statistics file"):
        load_stats(tmp_path / "bare.npy")


def test_an_interrupted_save_keeps_the_old_statistics(tmp_path, monkeypatch) -> None:
    mu, sigma = np.arange(3.0), np.eye(3)
    path = save_stats(tmp_path / "ref.npz", mu, sigma, "fd-mnist", 10)
    assert save_stats(tmp_path / "plain", mu, sigma, "fd-mnist", 10) == tmp_path / "plain.npz"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.npz", "ref.npz"]  # no temporary left

    def killed(file, **arrays):  # writes the start of an archive, then the process is interrupted
        if hasattr(file, "write"):
            file.write(b"PK\x03\x04" + bytes(100))
        else:
            Path(file).write_bytes(b"PK\x03\x04" + bytes(100))
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", killed)
    for target in (path, tmp_path / "new.npz"):
        with pytest.raises(KeyboardInterrupt):
            save_stats(target, mu + 1, sigma, "fd-mnist", 10)
    monkeypatch.undo()
    np.testing.assert_array_equal(load_stats(path, "fd-mnist")[0], mu)  # the old file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.npz", "ref.npz"]


def _low_rank_frechet(f1: np.ndarray, f2: np.ndarray) -> float:
    """The Fréchet distance of two small feature sets (N << D) through their N x N Gram matrices:
    with S = A A^T, the nonzero eigenvalues of S1 S2 are those of (A1^T A2)(A2^T A1)."""
    a1 = (f1 - f1.mean(0)).T / np.sqrt(len(f1) - 1)
    a2 = (f2 - f2.mean(0)).T / np.sqrt(len(f2) - 1)
    c = a1.T @ a2
    tr_covmean = np.sqrt(np.clip(np.linalg.eigvalsh(c @ c.T), 0, None)).sum()
    return float(((f1.mean(0) - f2.mean(0)) ** 2).sum() + (a1**2).sum() + (a2**2).sum() - 2 * tr_covmean)


@pytest.mark.slow
def test_fid_path_end_to_end_with_random_inception(tmp_path) -> None:
    """No download: the pytorch-fid network with random weights, on tiny grey and colour images.
    Its features are tiny (about 1e-8: nothing normalises them), so the distance (~1e-13) is
    checked against an independent computation, relatively."""
    torch.manual_seed(0)  # the random weights
    features = inception_features(random_init=True)
    gen = torch.Generator().manual_seed(0)
    real = torch.rand((3, 1, 16, 16), generator=gen) * 2 - 1
    fake = torch.rand((3, 3, 16, 16), generator=gen) * 2 - 1
    f_real = features(real)
    assert f_real.shape == (3, 2048) and torch.isfinite(f_real).all()
    assert torch.equal(f_real, features(real.repeat(1, 3, 1, 1)))  # grey: three equal channels
    ref = reference_stats("fid", real, features)
    np.testing.assert_allclose(ref[0], f_real.double().mean(0).numpy(), rtol=1e-6)
    assert ref[1].shape == (2048, 2048)
    save_stats(tmp_path / "ref.npz", *ref, "fid", 3)
    fd = fd_of_images(features, fake, load_stats(tmp_path / "ref.npz", "fid"))  # two 2048-d eigh: 2 s
    expected = _low_rank_frechet(f_real.double().numpy(), features(fake).double().numpy())
    assert expected > 0 and fd == pytest.approx(expected, rel=1e-5, abs=0)  # approx: abs 1e-12 by default


def test_inception_weights_path_must_exist(tmp_path) -> None:
    with pytest.raises(ScaleLongError, match="Inception weights not found"):
        load_inception(tmp_path / "pt_inception.pth")


def test_fd_mnist_classifier_accuracy() -> None:
    images, labels = embedded_mnist("test")
    assert accuracy(shipped_classifier(), images, labels) >= 0.97


def test_fd_mnist_separates_real_digits_from_noise() -> None:
    from scalelong.metrics.frechet import fd_mnist_features

    features, ref = fd_mnist_features(), mnist_reference_stats("train")
    real = fd_of_images(features, embedded_mnist("test")[0], ref)
    noise = fd_of_images(
        features, torch.rand((500, 1, 32, 32), generator=torch.Generator().manual_seed(0)) * 2 - 1, ref
    )
    blurred = fd_of_images(features, torch.nn.functional.avg_pool2d(embedded_mnist("test")[0], 3, 1, 1), ref)
    assert real * 20 < noise, (real, noise)
    assert real < blurred < noise, (real, blurred, noise)


def test_fd_mnist_scale_orders_damage_to_real_digits():
    """The yardstick of benchmarks/fd_mnist_scale.py: more damage of one kind, larger distance,
    and real held-out digits far below every damaged version that changes their strokes."""
    from benchmarks.fd_mnist_scale import scale

    images, labels = embedded_mnist("test")
    fd = scale(images[::2], labels[::2])  # 500 digits, 50 per class
    assert fd["real (held out)"] < 10
    for kind in (("gaussian noise 0.1", "gaussian noise 0.2", "gaussian noise 0.4"),
                 ("shifted 1 px", "shifted 2 px"),
                 ("blur 0.5 px", "blur 0.8 px", "blur 1.2 px"),
                 ("digits 0-8 only", "digits 0-4 only")):  # fmt: skip
        values = [fd[k] for k in kind]
        assert values == sorted(values), (kind, values)
    assert fd["strokes 1 px thicker (3x3 max)"] > 100 and fd["blur 0.8 px"] > 100
    assert fd["uniform noise"] > 1000
