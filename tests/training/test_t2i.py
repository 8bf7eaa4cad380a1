import pytest
import torch

from scalelong.data import LatentCaptions
from scalelong.diffusion import DiscreteDDPM
from scalelong.errors import ScaleLongError
from scalelong.models import UViT
from scalelong.training.t2i import extract_features, guided_eps_fn
from t2i_fixtures import (
    fake_coco,
    save_tiny_encoders,
    save_tiny_t2i_run,
    tiny_autoencoder,
    tiny_coco_features,
    tiny_text_encoder,
)

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


def _folder_bytes(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_extract_features_resumes_only_with_the_same_settings(tmp_path, capsys):
    """Skipping the shards of another shard size, resolution, captions file or encoder would duplicate or
    drop images, or mix latent shapes: such a resume is refused in one line naming the setting, and
    touches nothing; the same settings (also through the command line) resume."""
    import json

    from scalelong.cli import main

    images, captions = fake_coco(tmp_path)
    tokenizer, text = tiny_text_encoder(tmp_path)
    out = tmp_path / "feat"

    def extract(caps=captions, vae=None, **kw):
        kw = {"resolution": 32, "shard_size": 3, "progress": False, **kw}
        return extract_features(images, caps, out, vae or tiny_autoencoder(), tokenizer, text, **kw)

    extract()
    first = _folder_bytes(out)
    other_captions = tmp_path / "other.json"
    data = json.loads(captions.read_text())
    data["annotations"][0]["caption"] = "another caption"
    other_captions.write_text(json.dumps(data))
    other_vae = tiny_autoencoder()
    with torch.no_grad():
        next(other_vae.parameters()).add_(1.0)
    refused = {
        "--shard-size 3 there, 2 now": dict(shard_size=2),
        "--resolution 32 there, 64 now": dict(resolution=64),
        "captions file content differ": dict(caps=other_captions),
        "autoencoder weights differ": dict(vae=other_vae),
    }
    for says, kw in refused.items():
        with pytest.raises(ScaleLongError, match="other settings") as e:
            extract(**kw)
        assert says in str(e.value) and "new --out folder" in str(e.value) and "\n" not in str(e.value)
        assert _folder_bytes(out) == first, says
    # the same settings resume: a lost shard is written again, exactly
    (out / "shard-00001.safetensors").unlink()
    assert extract()["shards"] == 2 and _folder_bytes(out) == first
    assert len(LatentCaptions(out)) == 8
    # the command line: the same encoders saved as folders resume; another shard size is one line, exit 2
    save_tiny_encoders(tmp_path)
    argv = ["extract-features", str(images), str(captions), f"--out={out}", "--resolution=32", "--device=cpu"]
    argv += [f"--text-encoder={tmp_path / 'clip'}", f"--autoencoder={tmp_path / 'vae'}"]
    assert main([*argv, "--shard-size=3"]) == 0
    assert "4 images, 8 captions in 2 shards" in capsys.readouterr().out
    assert main([*argv, "--shard-size=1"]) == 2
    err = capsys.readouterr().err
    last = err.splitlines()[-1]  # before it: transformers' "Loading weights" bar of the encoders
    assert last.startswith("error: ") and "--shard-size 3 there, 1 now" in last, err
    assert "Traceback" not in err and _folder_bytes(out) == first


def test_an_interrupted_extraction_keeps_its_settings_and_is_not_read_half_done(tmp_path):
    """meta.json, with the settings, is written before the first shard: a killed extraction restarted
    with another shard size is refused, and training refuses the half-done folder in one line."""
    images, captions = fake_coco(tmp_path)
    tokenizer, text = tiny_text_encoder(tmp_path)
    out = tmp_path / "feat"

    def extract(**kw):
        kw = {"resolution": 32, "shard_size": 3, "progress": False, **kw}
        return extract_features(images, captions, out, tiny_autoencoder(), tokenizer, text, **kw)

    good = (images / "COCO_003.jpg").read_bytes()
    (images / "COCO_003.jpg").write_bytes(b"not a jpeg")  # stops the extraction in its second shard
    with pytest.raises(ScaleLongError, match="corrupt image file"):
        extract()
    assert (out / "shard-00000.safetensors").is_file() and not (out / "shard-00001.safetensors").exists()
    with pytest.raises(ScaleLongError, match="shard-00001.safetensors is missing .*same settings"):
        LatentCaptions(out)
    (images / "COCO_003.jpg").write_bytes(good)
    with pytest.raises(ScaleLongError, match="--shard-size 3 there, 4 now"):
        extract(shard_size=4)
    assert extract()["images"] == 4
    ds = LatentCaptions(out)
    assert len(ds) == 8 and torch.equal(ds[6][0], ds[7][0]) and not torch.equal(ds[5][0], ds[6][0])


def test_latent_captions_reads_only_the_shards_meta_json_lists(tmp_path):
    """A stray shard-* file (of another extraction) is not read: it would duplicate training data or
    break torch.cat; a listed shard missing, or meta.json missing or corrupt, is one line. Folders whose
    meta.json counts its shards instead of listing them still read."""
    import json

    from safetensors.torch import load_file, save_file

    out = tiny_coco_features(tmp_path)
    shard = load_file(out / "shard-00000.safetensors")
    save_file(shard, out / "shard-00001.safetensors")  # a duplicate of every image
    save_file({**shard, "latents": torch.zeros(4, 4, 8, 8)}, out / "shard-00002.safetensors")  # other shape
    ds = LatentCaptions(out)
    assert len(ds) == 8 and len(ds.latents) == 4
    meta = json.loads((out / "meta.json").read_text())
    legacy = {k: v for k, v in meta.items() if k not in ("shard_files", "settings", "captions_file")}
    (out / "meta.json").write_text(json.dumps(legacy))  # as extract-features wrote it before
    assert len(LatentCaptions(out)) == 8
    (out / "meta.json").write_text(
        json.dumps({**meta, "shard_files": meta["shard_files"] + ["shard-00007.safetensors"]})
    )
    with pytest.raises(ScaleLongError, match="shard-00007.safetensors is missing"):
        LatentCaptions(out)
    (out / "meta.json").write_text('{"images": 4, "shar')
    with pytest.raises(ScaleLongError, match="meta.json is unreadable") as e:
        LatentCaptions(out)
    assert "\n" not in str(e.value)
    (out / "meta.json").unlink()
    with pytest.raises(ScaleLongError, match="no feature shards"):
        LatentCaptions(out)


def test_a_prompts_file_that_is_not_text_is_one_line(tmp_path, capsys):
    from scalelong.cli import main

    binary = tmp_path / "prompts.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe\x80")
    code = main(
        ["sample", str(tmp_path / "run"), "--n=1", f"--out={tmp_path / 'x'}", "--prompts-file", str(binary)]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and str(binary) in err, err
    assert "UTF-8" in err and not (tmp_path / "x").exists()


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
