import pytest
import torch

from scalelong.data import LatentCaptions
from scalelong.diffusion import DiscreteDDPM
from scalelong.errors import ScaleLongError
from scalelong.models import UViT
from scalelong.training.t2i import extract_features, guided_eps_fn
from t2i_fixtures import fake_coco, save_tiny_t2i_run, tiny_autoencoder, tiny_text_encoder

pytest.importorskip("transformers")
pytest.importorskip("diffusers")


def test_t2i_uvit_at_recipe_size_has_the_release_parameter_count_and_334_tokens():
    with torch.device("meta"):  # shapes only
        model = UViT(in_channels=4, context_dim=768, skip_method="none")
        ls = UViT(in_channels=4, context_dim=768, skip_method="ls")
    assert sum(p.numel() for p in model.parameters()) == 44_692_644
    assert ls.num_tokens == 334
    assert ls.skip_scaling.gates[0].num_tokens == 334


def test_extract_features_from_fake_coco(tmp_path):
    images, captions = fake_coco(tmp_path)
    tokenizer, text = tiny_text_encoder(tmp_path)
    meta = extract_features(
        images,
        captions,
        tmp_path / "feat",
        tiny_autoencoder(),
        tokenizer,
        text,
        resolution=32,
        shard_size=3,
        batch_size=2,
        progress=False,
    )
    assert meta["images"] == 4 and meta["captions"] == 8 and meta["shards"] == 2
    ds = LatentCaptions(tmp_path / "feat")
    assert len(ds) == 8
    latent, context = ds[7]
    assert latent.shape == (4, 4, 4) and context.shape == (77, 32)
    # both captions of the last image point at the same latent
    assert torch.equal(ds[6][0], ds[7][0]) and not torch.equal(ds[5][0], ds[6][0])
    assert ds.null_context.shape == (77, 32)


def test_missing_captions_and_corrupt_image_give_one_line_errors(tmp_path):
    images, captions = fake_coco(tmp_path)
    tokenizer, text = tiny_text_encoder(tmp_path)
    with pytest.raises(ScaleLongError, match="captions file not found"):
        extract_features(images, tmp_path / "none.json", tmp_path / "f", tiny_autoencoder(), tokenizer, text)
    (images / "COCO_002.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(ScaleLongError, match="corrupt image file: .*COCO_002.jpg"):
        extract_features(
            images,
            captions,
            tmp_path / "f",
            tiny_autoencoder(),
            tokenizer,
            text,
            resolution=32,
            progress=False,
        )
    with pytest.raises(ScaleLongError, match="no feature shards"):
        LatentCaptions(tmp_path / "empty")


def test_guidance_scale_one_and_zero_are_exact():
    torch.manual_seed(0)
    net = UViT(
        img_size=8,
        patch_size=2,
        in_channels=4,
        embed_dim=32,
        depth=2,
        num_heads=2,
        context_dim=16,
        context_tokens=5,
    ).eval()
    schedule = DiscreteDDPM(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012)
    x, t = torch.randn(3, 4, 8, 8), torch.tensor([10.0, 500.0, 999.0])
    cond, uncond = {"context": torch.randn(3, 5, 16)}, {"context": torch.zeros(3, 5, 16)}
    with torch.no_grad():
        eps_c = net(x, t, **cond)
        eps_u = net(x, t, **uncond)
        assert torch.equal(guided_eps_fn(net, schedule, 1.0, cond, uncond)(x, t), eps_c)
        assert torch.equal(guided_eps_fn(net, schedule, 0.0, cond, uncond)(x, t), eps_u)
        mixed = guided_eps_fn(net, schedule, 3.0, cond, uncond)(x, t)
    torch.testing.assert_close(mixed, eps_u + 3.0 * (eps_c - eps_u), atol=1e-5, rtol=1e-5)


def test_cli_extract_train_and_sample_from_prompts_with_guidance(tmp_path, capsys):
    """The whole path through the command line, offline, with tiny encoders saved as local folders."""
    from scalelong.cli import main

    images, captions = fake_coco(tmp_path)
    tokenizer, text = tiny_text_encoder(tmp_path)
    tokenizer.save_pretrained(tmp_path / "clip")
    text.save_pretrained(tmp_path / "clip")
    tiny_autoencoder().save_pretrained(tmp_path / "vae")
    encoders = [f"--text-encoder={tmp_path / 'clip'}", f"--autoencoder={tmp_path / 'vae'}"]

    def cli(*args, code=0):
        assert main(list(args)) == code
        out, err = capsys.readouterr()
        return out if code == 0 else err

    extract = [
        "extract-features",
        str(images),
        str(captions),
        f"--out={tmp_path / 'feat'}",
        "--resolution=64",
    ]
    cli(*extract, "--device=cpu", *encoders)
    # a second call finds every shard written and only reports
    assert "4 images, 8 captions in 1 shards" in cli(*extract, *encoders)
    cli(
        "train",
        "configs/mscoco_uvit_s2_t2i.yaml",
        "--no-progress",
        f"out_dir={tmp_path}",
        "name=t2i",
        f"data.path={tmp_path / 'feat'}",
        "train.mixed_precision=no",
        "model.uvit.img_size=8",
        "model.uvit.embed_dim=32",
        "model.uvit.depth=2",
        "model.uvit.num_heads=2",
        "model.uvit.context_dim=32",
        "model.skip.method=ls",
        "train.steps=5",
        "train.batch_size=4",
        "train.log_every=1",
        "train.checkpoint_every=0",
        "optim.warmup_steps=1",
        "diagnostics.every=0",
    )
    out = cli(
        "sample",
        str(tmp_path / "t2i"),
        "--n=2",
        "--steps=5",
        f"--out={tmp_path / 'img'}",
        "--prompt=a photo number 1",
        "--prompt=a cat",
        "--guidance-scale=3",
        "--device=cpu",
        "--no-progress",
        *encoders,
    )
    assert "2 images (2 new)" in out
    from PIL import Image

    assert Image.open(tmp_path / "img" / "000001.png").size == (64, 64)
    assert (tmp_path / "img" / "prompts.txt").read_text().splitlines() == ["a photo number 1", "a cat"]
    # the folder is claimed for these prompts: others would mix two sets of images
    err = cli("sample", str(tmp_path / "t2i"), "--n=2", f"--out={tmp_path / 'img'}", "--prompt=a dog", code=2)
    assert err.count("\n") == 1 and "other settings" in err
    # a text-to-image run without prompts: one clear line, exit 2
    err = cli("sample", str(tmp_path / "t2i"), "--n=1", f"--out={tmp_path / 'x'}", code=2)
    assert err.count("\n") == 1 and "pass --prompt" in err and "Traceback" not in err


def test_prompt_sampling_refuses_other_settings_and_resumes_the_same(tmp_path, capsys):
    """One folder holds one set of images: another guidance scale, prompt list or seed is refused in
    one line and changes nothing there; the same settings (however the prompts are given) resume."""
    from scalelong.cli import main
    from scalelong.training.config import load_config

    cfg = load_config(
        "configs/mscoco_uvit_s2_t2i.yaml",
        [f"out_dir={tmp_path}", "name=t2i", "model.uvit.img_size=8", "model.uvit.embed_dim=32"]
        + ["model.uvit.depth=2", "model.uvit.num_heads=2", "model.uvit.context_dim=32"],
    )
    save_tiny_t2i_run(cfg, tmp_path)
    (tmp_path / "prompts.txt").write_text("a cat\na dog\n")
    out = tmp_path / "img"

    def sample(*args, n=2, folder=out, code=0):
        argv = ["sample", str(cfg.run_dir), f"--n={n}", f"--out={folder}", "--steps=3", "--device=cpu"]
        argv += ["--no-progress", f"--text-encoder={tmp_path / 'clip'}", f"--autoencoder={tmp_path / 'vae'}"]
        assert main([*argv, *args]) == code
        stdout, stderr = capsys.readouterr()
        return stdout if code == 0 else stderr

    def folder_bytes(folder=out):
        return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}

    settings = ["--prompt=a cat", "--prompt=a dog", "--guidance-scale=3", "--seed=0"]
    assert "2 images (2 new)" in sample(*settings)
    first = folder_bytes()
    assert (out / "prompts.txt").read_text() == "a cat\na dog\n"
    changed = {
        "guidance_scale": ["--prompt=a cat", "--prompt=a dog", "--guidance-scale=2", "--seed=0"],
        "prompts": ["--prompt=a cat", "--prompt=a bird", "--guidance-scale=3", "--seed=0"],
        "seed": ["--prompt=a cat", "--prompt=a dog", "--guidance-scale=3", "--seed=1"],
    }
    for key, args in changed.items():
        err = sample(*args, code=2)
        assert err.count("\n") == 1 and err.startswith("error: ") and key in err and "--out" in err, err
        assert folder_bytes() == first, key  # no image and no prompts.txt was touched
    # the same settings resume: nothing new; a lost image is redrawn exactly; more images extend it
    assert "2 images (0 new)" in sample("--prompts-file", str(tmp_path / "prompts.txt"), *settings[2:])
    (out / "000001.png").unlink()
    assert "2 images (1 new)" in sample(*settings)
    assert folder_bytes() == first
    assert "3 images (1 new)" in sample(*settings, n=3)
    assert (out / "prompts.txt").read_text() == "a cat\na dog\na cat\n"
    # other settings go to a folder of their own, whose images differ
    assert "2 images (2 new)" in sample(*changed["guidance_scale"], folder=tmp_path / "scale2")
    assert (tmp_path / "scale2" / "000000.png").read_bytes() != first["000000.png"]
