"""Text-to-image scored as U-ViT scores MS-COCO: reference statistics of centre-cropped validation
images, and `scalelong eval` with one validation caption per sample (tiny encoders, no download)."""

import numpy as np
import pytest
import torch

from scalelong.cli import main
from t2i_fixtures import fake_coco

pytest.importorskip("transformers")
pytest.importorskip("diffusers")


def cheap_features(shapes: list):
    """A stand-in for the Inception: the channel means, recording the image shapes it was given."""

    def features(images: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(images.shape))
        return torch.cat([images.mean((2, 3)), images.std((2, 3))], 1)

    return features


def test_fid_stats_of_an_image_folder_centre_cropped_to_the_run_resolution(tmp_path, capsys, monkeypatch):
    images, _ = fake_coco(tmp_path, n=5, size=(40, 30))
    shapes: list = []
    monkeypatch.setattr("scalelong.evaluation.feature_fn", lambda *a, **k: cheap_features(shapes))
    t2i = ["model.uvit.img_size=4", "model.uvit.embed_dim=32", "model.uvit.depth=2", "model.uvit.num_heads=2"]
    argv = ["fid-stats", "configs/mscoco_uvit_s2_t2i.yaml", *t2i, "--images", str(images), "--device=cpu"]
    # the run's resolution: 8 x the latent side of a text-to-image run
    assert main([*argv, "--out", str(tmp_path / "a.npz"), "--batch-size=2", "--no-progress"]) == 0
    assert "5 images" in capsys.readouterr().out
    assert shapes == [(2, 3, 32, 32), (2, 3, 32, 32), (1, 3, 32, 32)]  # streamed in batches
    with np.load(tmp_path / "a.npz") as f:
        assert int(f["n"]) == 5 and f["mu"].shape == (6,)
    shapes.clear()
    assert main([*argv, "--out", str(tmp_path / "b.npz"), "--center-crop=16", "--no-progress"]) == 0
    assert shapes == [(5, 3, 16, 16)]
    # the crop is extract-features' (shorter side resized, centre square), so references match training
    from PIL import Image

    from scalelong.data import from_uint8
    from scalelong.t2i import center_crop

    with Image.open(sorted(images.iterdir())[0]) as im:
        crop = from_uint8(center_crop(im.convert("RGB"), 16).transpose(2, 0, 1))
    captured = []
    monkeypatch.setattr(
        "scalelong.evaluation.feature_fn", lambda *a, **k: lambda x: captured.append(x) or x.mean((2, 3))
    )
    assert main([*argv, "--out", str(tmp_path / "c.npz"), "--center-crop=16", "--no-progress"]) == 0
    torch.testing.assert_close(captured[0][0], crop)
