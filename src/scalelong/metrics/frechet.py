"""Fréchet distances: FID (pytorch-fid's Inception) and the offline FD-MNIST.

FID is computed in stages, as in the literature: reference statistics (mean and covariance of
features of the training set) go to an explicit ``.npz`` file once; evaluation loads that file
first, so a bad path fails before any sampling. Images enter every feature extractor as float
tensors (B, C, H, W) in [-1, 1]; they are quantised to 8 bits first, as if saved as PNG.

* ``fid``: pool3 features (2048) of pt_inception-2015-12-05 through the ``pytorch-fid`` package
  (optional extra ``fid``); grey images are repeated to three channels.
* ``fd-mnist``: hidden features (128) of the shipped digit classifier (see :mod:`scalelong.metrics.fd_mnist`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import socket
import warnings
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from unittest.mock import patch

import numpy as np
import torch

from scalelong.data import embedded_mnist, to_uint8
from scalelong.errors import ScaleLongError, first_line
from scalelong.metrics import METRIC_NAMES
from scalelong.metrics.fd_mnist import shipped_classifier

METRICS = METRIC_NAMES
FeatureFn = Callable[[torch.Tensor], torch.Tensor]


# ----------------------------------------------------------------------------- the distance


def _sqrtm_psd(a: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh((a + a.T) / 2)
    return (v * np.sqrt(np.clip(w, 0, None))) @ v.T


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray) -> float:
    """||mu1 - mu2||^2 + tr(S1 + S2 - 2 (S1^1/2 S2 S1^1/2)^1/2), the Fréchet distance of two Gaussians.

    The trace of the matrix square root is taken from the eigenvalues of the symmetric PSD
    product S1^1/2 S2 S1^1/2, which is stable where ``scipy.linalg.sqrtm`` of S1 S2 can go complex.
    """
    mu1, mu2 = np.asarray(mu1, np.float64), np.asarray(mu2, np.float64)
    s1, s2 = np.atleast_2d(sigma1).astype(np.float64), np.atleast_2d(sigma2).astype(np.float64)
    if mu1.shape != mu2.shape or s1.shape != s2.shape:
        raise ScaleLongError(f"feature statistics do not match: {mu1.shape} vs {mu2.shape}; another metric?")
    r1 = _sqrtm_psd(s1)
    eig = np.linalg.eigvalsh(r1 @ s2 @ r1)
    tr_covmean = np.sqrt(np.clip(eig, 0, None)).sum()
    return float(((mu1 - mu2) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * tr_covmean)


def feature_stats(features: torch.Tensor | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean (D,) and covariance (D, D) of features (N, D), in float64."""
    f = np.asarray(features, dtype=np.float64)
    if f.ndim != 2 or len(f) < 2:
        raise ScaleLongError(f"need at least 2 feature vectors of shape (N, D), got {f.shape}")
    return f.mean(axis=0), np.cov(f, rowvar=False)


def save_stats(
    path: str | Path, mu: np.ndarray, sigma: np.ndarray, metric: str, n: int, resolution: int | None = None
) -> Path:
    """Write reference statistics (``mu``, ``sigma`` as pytorch-fid names them, plus the metric and,
    when given, the side of the square images they describe)."""
    path = Path(path)
    if path.suffix != ".npz":  # what np.savez writes: name the file it makes
        path = path.with_name(f"{path.name}.npz")
    side = {} if resolution is None else {"resolution": np.array(resolution)}
    # Written beside the target and renamed over it, so an interrupted write never leaves a truncated
    # file under the final name; through a file object, so numpy appends no .npz to the temporary name.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with tmp.open("wb") as f:
                np.savez(f, mu=mu, sigma=sigma, metric=np.array(metric), n=np.array(n), **side)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:  # interrupted or failed: leave no temporary file behind
            tmp.unlink(missing_ok=True)
            raise
    except OSError as e:
        raise ScaleLongError(
            f"cannot write the statistics {path} ({e.strerror or e}); choose another --out"
        ) from None
    return path


# What np.load raises for a file cut short or overwritten with garbage, besides OSError and ValueError.
_DAMAGED = (zipfile.BadZipFile, EOFError)


def _damaged(path: str | Path, e: BaseException) -> ScaleLongError:
    return ScaleLongError(
        f"reference statistics {path} are damaged ({first_line(e, name=True)}); "
        "make them again with `scalelong fid-stats`"
    )


def stored_metric(path: str | Path) -> str | None:
    """The metric an ``.npz`` of :func:`save_stats` records (None for other files, e.g. pytorch-fid's)."""
    try:
        with np.load(path) as f:
            return str(f["metric"]) if "metric" in f.files else None
    except _DAMAGED as e:
        raise _damaged(path, e) from None
    except (OSError, ValueError, TypeError):  # TypeError: a bare .npy, no archive; load_stats says so
        return None


def stored_resolution(path: str | Path) -> int | None:
    """The image side an ``.npz`` of :func:`save_stats` records (None for files written without it)."""
    try:
        with np.load(path) as f:
            return int(f["resolution"]) if "resolution" in f.files else None
    except _DAMAGED as e:
        raise _damaged(path, e) from None
    except (OSError, ValueError, TypeError):
        return None


def load_stats(path: str | Path, metric: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Read ``mu`` and ``sigma`` from an ``.npz``; check the metric when the file records one."""
    path = Path(path)
    if not path.is_file():
        raise ScaleLongError(f"reference statistics not found: {path}; make them with `scalelong fid-stats`")
    try:
        with np.load(path) as f:
            mu, sigma = f["mu"], f["sigma"]
            stored = str(f["metric"]) if "metric" in f.files else None
    except _DAMAGED as e:
        raise _damaged(path, e) from None
    except (OSError, ValueError, KeyError, TypeError) as e:  # TypeError: a bare .npy, no archive
        raise ScaleLongError(f"{path} is not a statistics file with 'mu' and 'sigma' ({e})") from e
    if metric is not None and stored is not None and stored != metric:
        raise ScaleLongError(f"{path} holds {stored} statistics but the metric is {metric}")
    mu, sigma = np.asarray(mu), np.asarray(sigma)
    if mu.ndim != 1 or sigma.shape != (len(mu), len(mu)) or mu.dtype.kind not in "fiu":
        raise ScaleLongError(
            f"{path} holds mu {mu.shape} and sigma {sigma.shape}; expected (D,) and (D, D) numbers"
        )
    if sigma.dtype.kind not in "fiu" or not (np.isfinite(mu).all() and np.isfinite(sigma).all()):
        raise ScaleLongError(
            f"{path} holds NaN or infinite statistics; make it again with `scalelong fid-stats`"
        )
    return mu, sigma


# ----------------------------------------------------------------------------- feature extractors


def quantize(images: torch.Tensor) -> torch.Tensor:
    """[-1, 1] floats -> the [0, 1] values an 8-bit PNG of them would hold."""
    return to_uint8(images).float() / 255.0


def fd_mnist_features(device: torch.device | str = "cpu") -> FeatureFn:
    """Hidden features of the shipped digit classifier; images (B, 1, 32, 32) in [-1, 1]."""
    net = copy.deepcopy(shipped_classifier()).to(device)

    @torch.no_grad()
    def features(images: torch.Tensor) -> torch.Tensor:
        if tuple(images.shape[1:]) != (1, 32, 32):
            raise ScaleLongError(
                f"fd-mnist scores 1x32x32 digit images, got {tuple(images.shape[1:])}; use eval.metric=fid"
            )
        return net.features(quantize(images).to(device) * 2 - 1).cpu()

    return features


FID_WEIGHTS_FILE = "pt_inception-2015-12-05-6726825d.pth"


def _offline_message(reason: str) -> str:
    from pytorch_fid.inception import FID_WEIGHTS_URL

    hub = Path(torch.hub.get_dir()) / "checkpoints"
    return (
        f"FID needs the Inception weights and they could not be downloaded ({reason}); download "
        f"{FID_WEIGHTS_URL} and pass --inception-weights PATH (or put the file in {hub}/)"
    )


def _probe(url: str, timeout: float = 15.0) -> str | None:
    """None if ``url`` answers, else why not (one line)."""
    import urllib.request

    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout).close()
        return None
    except Exception as e:  # no network, DNS, proxy, TLS, HTTP errors
        return first_line(e, name=True)


def load_inception(weights: str | Path | None = None, random_init: bool = False) -> torch.nn.Module:
    """pytorch-fid's InceptionV3 returning pool3 features, in eval mode on the CPU.

    ``weights``: a local copy of pt_inception-2015-12-05 (offline machines); None: the package's
    own download (cached under torch hub). ``random_init``: no weights at all, for tests.
    """
    try:
        from pytorch_fid import inception as pfi
    except ImportError as e:
        raise ScaleLongError("FID needs pytorch-fid: pip install 'scalelong[fid]'") from e

    def from_file(url: str, progress: bool = True):
        path = Path(weights)
        if not path.is_file():
            raise ScaleLongError(f"Inception weights not found: {path}; download {pfi.FID_WEIGHTS_URL}")
        return torch.load(path, map_location="cpu", weights_only=True)

    def fetch(url: str, progress: bool = True):
        cached = Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[-1]
        reason = None if cached.is_file() else _probe(url)
        if reason is not None:  # say so in one line, before torch announces a download that cannot happen
            raise ScaleLongError(_offline_message(reason))
        timeout = socket.getdefaulttimeout()
        socket.setdefaulttimeout(60)  # behind a firewall that drops packets, fail instead of hanging
        try:
            return original(url, progress=progress)
        except Exception as e:  # URLError, HTTPError, socket and SSL errors all mean: not reachable
            raise ScaleLongError(_offline_message(first_line(e, name=True))) from e
        finally:
            socket.setdefaulttimeout(timeout)

    original = pfi.load_state_dict_from_url
    with contextlib.ExitStack() as stack:
        # pytorch-fid fetches its weights inside its constructor; we swap in where they come from
        loader = from_file if weights is not None else fetch
        if random_init:
            from torchvision.models.inception import Inception3

            loader = lambda url, progress=True: {}  # noqa: E731
            stack.enter_context(patch.object(Inception3, "load_state_dict", lambda self, *a, **k: None))
        stack.enter_context(patch.object(pfi, "load_state_dict_from_url", loader))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torchvision's notice on default init
            net = pfi.InceptionV3([pfi.InceptionV3.BLOCK_INDEX_BY_DIM[2048]])
    return net.eval()


def inception_features(
    device: torch.device | str = "cpu", weights: str | Path | None = None, random_init: bool = False
) -> FeatureFn:
    """Pool3 features (B, 2048) of the FID Inception; images (B, 1 or 3, H, W) in [-1, 1]."""
    net = load_inception(weights, random_init).to(device)

    @torch.no_grad()
    def features(images: torch.Tensor) -> torch.Tensor:
        x = quantize(images).to(device)
        if x.shape[1] == 1:
            x = x.repeat(1, 3, 1, 1)
        return net(x)[0].flatten(1).cpu()  # the network resizes to 299 and rescales to [-1, 1]

    return features


def feature_fn(
    metric: str,
    device: torch.device | str = "cpu",
    inception_weights: str | Path | None = None,
    random_init: bool = False,
) -> FeatureFn:
    if metric == "fd-mnist":
        return fd_mnist_features(device)
    if metric == "fid":
        return inception_features(device, inception_weights, random_init)
    raise ScaleLongError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")


def batch_features(features: FeatureFn, images: Iterable[torch.Tensor]) -> torch.Tensor:
    """Concatenate the features of an iterable of image batches."""
    return torch.cat([features(b) for b in images])


def fd_of_images(
    features: FeatureFn, images: torch.Tensor, ref: tuple[np.ndarray, np.ndarray], batch: int = 250
):
    """Fréchet distance of a set of images (N, C, H, W) in [-1, 1] to reference statistics."""
    mu, sigma = feature_stats(batch_features(features, images.split(batch)))
    return frechet_distance(mu, sigma, *ref)


def reference_stats(
    metric: str, images: torch.Tensor, features: FeatureFn | None = None, batch: int = 250
) -> tuple[np.ndarray, np.ndarray]:
    """Statistics of a reference image set (N, C, H, W) in [-1, 1]."""
    features = features or feature_fn(metric)
    return feature_stats(batch_features(features, images.split(batch)))


@functools.lru_cache(maxsize=2)
def mnist_reference_stats(split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """FD-MNIST statistics of the embedded digits (the default reference of the demo); cached, read-only."""
    return reference_stats("fd-mnist", embedded_mnist(split)[0])


__all__ = [
    "METRICS",
    "batch_features",
    "fd_of_images",
    "feature_fn",
    "feature_stats",
    "frechet_distance",
    "inception_features",
    "fd_mnist_features",
    "load_inception",
    "load_stats",
    "mnist_reference_stats",
    "quantize",
    "reference_stats",
    "save_stats",
    "stored_metric",
    "stored_resolution",
]
