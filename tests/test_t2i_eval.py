"""Text-to-image scored as U-ViT scores MS-COCO: reference statistics of centre-cropped validation
images, and `scalelong eval` with one validation caption per sample (tiny encoders, no download)."""

import json

import numpy as np
import pytest
import torch

from scalelong.cli import main
from t2i_fixtures import fake_coco, save_tiny_t2i_run

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
    monkeypatch.setattr("scalelong.training.evaluation.feature_fn", lambda *a, **k: cheap_features(shapes))
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
    from scalelong.training.t2i import center_crop

    with Image.open(sorted(images.iterdir())[0]) as im:
        crop = from_uint8(center_crop(im.convert("RGB"), 16).transpose(2, 0, 1))
    captured = []
    monkeypatch.setattr(
        "scalelong.training.evaluation.feature_fn",
        lambda *a, **k: lambda x: captured.append(x) or x.mean((2, 3)),
    )
    assert main([*argv, "--out", str(tmp_path / "c.npz"), "--center-crop=16", "--no-progress"]) == 0
    torch.testing.assert_close(captured[0][0], crop)


def val_captions(tmp_path, count=5):
    path = tmp_path / "captions_val2014.json"
    annotations = [{"image_id": 7 + i // 2, "id": i, "caption": f"caption number {i} "} for i in range(count)]
    path.write_text(json.dumps({"images": [], "annotations": annotations}))
    return path


def test_caption_choice_is_seeded_wraps_and_ignores_the_process_count():
    from scalelong.training.evaluation import choose_captions

    captions = [f"c{i}" for i in range(10)]
    first = choose_captions(captions, 6, seed=3)
    assert first == choose_captions(captions, 6, seed=3) and len(set(first)) == 6
    assert first != choose_captions(captions, 6, seed=4)
    assert choose_captions(captions, 4, seed=3) == first[:4]  # sample i takes entry i, whatever n
    wrapped = choose_captions(captions, 25, seed=3)
    assert wrapped[:10] == choose_captions(captions, 10, seed=3) and wrapped[10:20] == wrapped[:10]
    assert sorted(wrapped[:10]) == sorted(captions) and wrapped == choose_captions(captions, 25, seed=3)


@pytest.fixture()
def t2i_run(tmp_path, monkeypatch):
    """A tiny untrained text-to-image run, local tiny encoders, validation captions, reference stats."""
    from scalelong.training.config import load_config

    shapes: list = []
    monkeypatch.setattr("scalelong.training.evaluation.feature_fn", lambda *a, **k: cheap_features(shapes))
    small = [
        "model.uvit.img_size=4",
        "model.uvit.embed_dim=32",
        "model.uvit.depth=2",
        "model.uvit.num_heads=2",
    ]
    small += ["model.uvit.context_dim=32", "eval.steps=2", "eval.batch_size=3", "t2i.guidance_scale=2"]
    small += [f"t2i.text_encoder={tmp_path / 'clip'}", f"t2i.autoencoder={tmp_path / 'vae'}"]
    cfg = load_config("configs/mscoco_uvit_s2_t2i.yaml", [f"out_dir={tmp_path}", "name=t2i", *small])
    save_tiny_t2i_run(cfg, tmp_path)
    images, _ = fake_coco(tmp_path, n=3, size=(40, 30))
    fid = ["fid-stats", "configs/mscoco_uvit_s2_t2i.yaml", *small, "--images", str(images), "--device=cpu"]
    assert main([*fid, "--out", str(tmp_path / "coco_val.npz"), "--no-progress"]) == 0
    return cfg, val_captions(tmp_path), tmp_path / "coco_val.npz", shapes


def eval_cli(capsys, cfg, *args):
    rc = main(["eval", str(cfg.run_dir), "--device=cpu", "--no-progress", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def test_eval_of_a_t2i_run_samples_one_validation_caption_each_and_records_the_protocol(t2i_run, capsys):
    cfg, captions, stats, shapes = t2i_run
    capsys.readouterr()
    shapes.clear()
    rc, out, err = eval_cli(capsys, cfg, "--n", 4, "--captions", captions, "--fid-stats", stats)
    assert rc == 0, err
    assert shapes[1:] == [
        (3, 3, 32, 32),
        (1, 3, 32, 32),
    ]  # after the size probe; decoded by the autoencoder at 8 x the latent side
    (path,) = (cfg.run_dir / "eval").iterdir()
    record = json.loads(path.read_text())
    assert record["captions"] == str(captions) and record["captions_count"] == 5
    assert record["fd_samples"] == 4 and record["guidance_scale"] == 2.0
    assert record["fd_sampler"] == "dpm_solver" and record["fd_steps"] == 2
    from scalelong.training.evaluation import EVAL_SEED_OFFSET, choose_captions, read_caption_list

    chosen = choose_captions(read_caption_list(captions), 4, cfg.train.seed * EVAL_SEED_OFFSET)
    assert record["captions_sampled"] == chosen and chosen[0] == chosen[0].strip()
    assert "-cfg2-" in path.name and f"{record['fd']:.4f}" in out
    # guidance 1 (the conditional model) and 0 (the unconditional one) are scored apart
    for scale in (0, 1):
        rc, _, err = eval_cli(
            capsys, cfg, "--n", 2, "--captions", captions, "--fid-stats", stats, "--guidance-scale", scale
        )
        assert rc == 0, err
    names = sorted(p.name for p in (cfg.run_dir / "eval").iterdir())
    assert [n for n in names if "-cfg0-" in n] and [n for n in names if "-cfg1-" in n]


def test_eval_of_a_t2i_run_refuses_bad_input_in_one_line_and_writes_nothing(
    t2i_run, tmp_path, capsys, monkeypatch
):
    cfg, captions, stats, _ = t2i_run
    capsys.readouterr()

    def refused(*args, match):
        rc, out, err = eval_cli(capsys, cfg, "--n", 2, *args)
        assert rc == 2 and err.count("\n") == 1 and err.startswith("error: ") and match in err, err
        assert not (cfg.run_dir / "eval").exists()

    not_coco = tmp_path / "plain.json"
    not_coco.write_text(json.dumps(["a cat", "a dog"]))
    refused("--captions", not_coco, "--fid-stats", stats, match="annotations")
    np.savez(
        tmp_path / "wide.npz", mu=np.zeros(2048), sigma=np.eye(2048), metric=np.array("fid"), n=np.array(9)
    )
    refused("--captions", captions, "--fid-stats", tmp_path / "wide.npz", match="2048")
    refused("--fid-stats", stats, match="--captions")  # a text-to-image run needs its captions
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    refused(
        "--captions",
        captions,
        "--fid-stats",
        stats,
        "--autoencoder",
        "nobody/no-such-vae",
        match="autoencoder",
    )


def test_captions_given_to_a_run_that_is_not_text_to_image_are_refused(tmp_path, capsys):
    from scalelong.training.build import build_model
    from scalelong.training.checkpoint import save_checkpoint
    from scalelong.training.config import config_to_dict, load_config, save_config

    cfg = load_config(None, ["model.uvit.img_size=32", "model.uvit.patch_size=8", "model.uvit.in_channels=1"]
                      + ["model.uvit.embed_dim=16", "model.uvit.depth=2", "model.uvit.num_heads=2"]
                      + ["name=digits", f"out_dir={tmp_path}"])  # fmt: skip
    cfg.run_dir.mkdir(parents=True)
    save_config(cfg, cfg.run_dir / "config.yaml")
    model = build_model(cfg.model)
    save_checkpoint(cfg.run_dir / "checkpoints", 1, model, model, config_to_dict(cfg))
    rc, _, err = eval_cli(capsys, cfg, "--n", 2, "--captions", val_captions(tmp_path), "--metric", "fd-mnist")
    assert rc == 2 and err.count("\n") == 1 and "not a text-to-image run" in err, err
    assert not (cfg.run_dir / "eval").exists()
