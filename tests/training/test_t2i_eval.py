"""Text-to-image scored as U-ViT scores MS-COCO: reference statistics of centre-cropped validation
images, and `scalelong eval` with one validation caption per sample (tiny encoders, no download)."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import run_cli
from scalelong.cli import main
from t2i_fixtures import (
    fake_coco,
    save_tiny_clip_model,
    save_tiny_encoders,
    save_tiny_t2i_run,
    tiny_coco_features,
)

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
        assert int(f["resolution"]) == 32  # the side of the images, which the runs' samples must match
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
    return run_cli(capsys, "eval", cfg.run_dir, "--device=cpu", "--no-progress", *args)


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
    images = tmp_path / "train2014"
    fid = ["fid-stats", "configs/mscoco_uvit_s2_t2i.yaml", "--images", str(images), "--center-crop=16"]
    assert main([*fid, "--device=cpu", "--no-progress", "--out", str(tmp_path / "small.npz")]) == 0
    capsys.readouterr()
    refused("--captions", captions, "--fid-stats", tmp_path / "small.npz", match="16x16")
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


def test_captions_or_clip_given_to_a_run_that_is_not_text_to_image_are_refused(tmp_path, capsys):
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
    clip = save_tiny_clip_model(tmp_path / "clip-score")
    capsys.readouterr()
    rc, _, err = eval_cli(capsys, cfg, "--n", 2, "--clip", clip, "--metric", "fd-mnist")
    assert rc == 2 and err.count("\n") == 1 and "not a text-to-image run" in err and "--clip" in err, err
    assert not (cfg.run_dir / "eval").exists()


# ----------------------------------------------------------------------------- CLIP score


def clip_cosines(folder, images: torch.Tensor, captions: list[str]) -> torch.Tensor:
    """The cosine of each image's CLIP embedding with its caption's, computed apart from scalelong:
    the images as PNGs of them hold them (PIL images), embedded by ``CLIPModel``'s own forward."""
    from PIL import Image
    from transformers import CLIPModel, CLIPProcessor

    model = CLIPModel.from_pretrained(folder, local_files_only=True).eval()
    processor = CLIPProcessor.from_pretrained(folder, local_files_only=True)
    pixels = ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    inputs = processor(text=captions, images=[Image.fromarray(p) for p in pixels], return_tensors="pt",
                       padding=True)  # fmt: skip
    with torch.no_grad():
        out = model(**inputs)
    return (out.image_embeds * out.text_embeds).sum(-1)  # CLIPModel's embeddings are unit vectors


def test_eval_with_clip_records_the_clip_score_of_each_sample_with_its_caption(
    t2i_run, tmp_path, capsys, monkeypatch
):
    import sys

    import scalelong.training.t2i as t2i

    cfg, captions, stats, _ = t2i_run
    clip = save_tiny_clip_model(tmp_path / "clip-score")
    decoded: list[torch.Tensor] = []  # the samples as the autoencoder decodes them, in seed order
    decode = t2i.decode_latents
    monkeypatch.setattr(t2i, "decode_latents", lambda *a, **k: decoded.append(decode(*a, **k)) or decoded[-1])
    monkeypatch.delitem(sys.modules, "scalelong.metrics.clip_score", raising=False)
    capsys.readouterr()
    args = ["--n", 4, "--captions", captions, "--fid-stats", stats]
    rc, out, err = eval_cli(capsys, cfg, *args)
    assert rc == 0, err
    (path,) = (cfg.run_dir / "eval").iterdir()
    plain = json.loads(path.read_text())
    assert "clip_score" not in plain and "clip_model" not in plain and "CLIP" not in out
    assert "scalelong.metrics.clip_score" not in sys.modules  # off by default: nothing of CLIP loaded
    decoded.clear()
    rc, out, err = eval_cli(capsys, cfg, *args, "--clip", clip)
    assert rc == 0, err
    record = json.loads(path.read_text())
    assert record["clip_model"] == str(clip) and record["fd"] == plain["fd"]
    cos = clip_cosines(clip, torch.cat(decoded), record["captions_sampled"])
    assert len(cos) == 4 and (cos > 0).any() and (cos < 0).any()  # so max(cos, 0) and cos differ here
    assert record["clip_score"] == pytest.approx((100 * cos.clamp(min=0)).mean().item(), rel=1e-5)
    assert f"CLIP score {record['clip_score']:.2f}" in out


def test_the_clip_score_of_samples_split_over_processes_is_that_of_one_process(
    t2i_run, tmp_path, monkeypatch
):
    import accelerate.utils

    from scalelong.metrics.clip_score import load_clip_score
    from scalelong.training.evaluation import caption_sampling, read_caption_list, score_model
    from scalelong.training.runs import load_model

    cfg, captions, _, _ = t2i_run
    clip = load_clip_score(save_tiny_clip_model(tmp_path / "clip-score"))
    ema = load_model(cfg.run_dir / "checkpoints" / "step-000001", cfg.model, "ema")
    sampling = caption_sampling(cfg, read_caption_list(captions), 5)
    ref = (np.zeros(3), np.eye(3))

    def score(accelerator=None):
        return score_model(ema, cfg, lambda x: x.mean((2, 3)), ref, 5, accelerator=accelerator,
                           captions=sampling, clip=clip)  # fmt: skip

    one = score()
    shares: list = []  # process 1 draws first; the main process gathers both shares in rank order
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda share: shares.extend(share) or shares[::-1])
    assert score(ProcessShare(1)) is None
    two = score(ProcessShare(0))
    assert len(shares) == 2 and [len(s) for s in shares] == [3, 2]
    assert two.clip == pytest.approx(one.clip, rel=1e-6) and two.fd == pytest.approx(one.fd, rel=1e-6)


def test_eval_with_clip_refuses_a_folder_that_is_not_a_clip_model_in_one_line(t2i_run, tmp_path, capsys):
    cfg, captions, stats, _ = t2i_run
    clip = save_tiny_clip_model(tmp_path / "clip-score")
    no_processor = tmp_path / "clip-model-only"
    no_processor.mkdir()
    for name in ("config.json", "model.safetensors"):
        (no_processor / name).write_bytes((clip / name).read_bytes())
    (tmp_path / "empty").mkdir()
    capsys.readouterr()

    def refused(folder, match):
        rc, out, err = eval_cli(
            capsys, cfg, "--n", 2, "--captions", captions, "--fid-stats", stats, "--clip", folder
        )
        assert rc == 2 and err.count("\n") == 1 and err.startswith("error: ") and match in err, err
        assert not (cfg.run_dir / "eval").exists()

    refused(tmp_path / "nowhere", match="CLIP model folder not found")
    refused(clip / "config.json", match="CLIP model folder not found")
    refused(tmp_path / "empty", match="not a CLIP model")
    refused(tmp_path / "clip", match="not a CLIP model")  # a CLIP text encoder alone
    refused(tmp_path / "vae", match="not a CLIP model")
    refused(no_processor, match="not a CLIP model")


# ----------------------------------------------------------------------------- during training

T2I_CONFIG = "configs/mscoco_uvit_s2_t2i.yaml"
TINY_T2I = [
    "model.uvit.img_size=4",
    "model.uvit.embed_dim=32",
    "model.uvit.depth=2",
    "model.uvit.num_heads=2",
    "model.uvit.context_dim=32",
]
# The keys of a training-time evaluation record, as every recipe logs them.
EVAL_KEYS = {"fd", "fd_metric", "fd_samples", "fd_sampler", "fd_steps", "fd_precision", "fd_seconds"}


@pytest.fixture()
def t2i_training(tmp_path, monkeypatch):
    """A tiny text-to-image run that evaluates every 2 of its 4 steps on 3 samples and re-scores
    the best step on 4: feature shards of a fake MS-COCO, the tiny encoders, validation captions
    and reference statistics at the run's resolution; the ``scalelong train`` arguments."""
    shapes: list = []
    monkeypatch.setattr("scalelong.training.evaluation.feature_fn", lambda *a, **k: cheap_features(shapes))
    save_tiny_encoders(tmp_path)
    features = tiny_coco_features(tmp_path / "coco", resolution=32)
    stats = tmp_path / "coco_val.npz"
    images = tmp_path / "coco" / "train2014"
    fid = ["fid-stats", T2I_CONFIG, *TINY_T2I, "--images", str(images), "--device=cpu", "--no-progress"]
    assert main([*fid, "--out", str(stats)]) == 0
    captions = val_captions(tmp_path)
    argv = ["train", T2I_CONFIG, "--no-progress", f"out_dir={tmp_path / 'runs'}", "name=t2i"]
    argv += [f"data.path={features}", *TINY_T2I, "t2i.guidance_scale=2"]
    argv += [f"t2i.text_encoder={tmp_path / 'clip'}", f"t2i.autoencoder={tmp_path / 'vae'}"]
    argv += ["train.mixed_precision=no", "train.steps=4", "train.batch_size=4", "train.log_every=1"]
    argv += ["train.checkpoint_every=2", "train.keep_checkpoints=0", "train.tensorboard=false"]
    argv += ["optim.warmup_steps=1", "diagnostics.every=0", "diagnostics.noise_levels=0"]
    argv += ["eval.every=2", "eval.metric=fid", f"eval.fid_stats={stats}", f"eval.captions={captions}"]
    argv += ["eval.num_samples=3", "eval.steps=2", "eval.batch_size=2", "eval.final_num_samples=4"]
    shapes.clear()
    return SimpleNamespace(argv=argv, captions=captions, stats=stats, run_dir=tmp_path / "runs" / "t2i",
                           shapes=shapes, images=images)  # fmt: skip


def record_prompts(monkeypatch) -> list[list[str]]:
    """The captions the text encoder is given, batch by batch (the empty caption of guidance left out)."""
    import scalelong.training.t2i as t2i

    encoded, encode = [], t2i.encode_prompts

    def recording(prompts, *args, **kwargs):
        if list(prompts) != [""]:
            encoded.append(list(prompts))
        return encode(prompts, *args, **kwargs)

    monkeypatch.setattr(t2i, "encode_prompts", recording)
    return encoded


def test_training_scores_a_t2i_run_on_fixed_validation_captions_and_rescores_the_best_step(
    t2i_training, capsys, monkeypatch
):
    from scalelong.training.evaluation import EVAL_SEED_OFFSET, choose_captions, read_caption_list
    from scalelong.training.runs import RunDir

    encoded = record_prompts(monkeypatch)
    assert main(t2i_training.argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    run = RunDir(t2i_training.run_dir)
    records = run.eval_records()
    assert sorted(records) == [2, 4]  # every eval.every steps
    for r in records.values():  # the keys every recipe logs, so the best step is chosen alike
        assert {k for k in r if k.startswith("fd")} == EVAL_KEYS
        assert (r["fd_metric"], r["fd_samples"], r["fd_sampler"], r["fd_steps"]) == (
            "fid",
            3,
            "dpm_solver",
            2,
        )
    base = run.config().train.seed * EVAL_SEED_OFFSET
    chosen = choose_captions(read_caption_list(t2i_training.captions), 4, base)  # as `scalelong eval` draws
    each_evaluation = [chosen[:2], chosen[2:3]]  # 3 samples in batches of 2
    # steps 2 and 4, then the re-score's fourth sample: its first three are the evaluation's
    assert encoded == [*each_evaluation, *each_evaluation, chosen[3:4]]
    assert {shape[1:] for shape in t2i_training.shapes} == {(3, 32, 32)}  # decoded: 8 x the latent side
    best = run.best_step("fid")
    final = json.loads(run.eval_final_file.read_text())
    assert final["best_step"] == best and final["fd_samples"] == 4 and final["fd_samples_reused"] == 3
    assert final["fd_at_eval"] == records[best]["fd"] and final["fd_metric"] == "fid"
    assert final["captions"] == str(t2i_training.captions) and final["captions_count"] == 5
    assert final["guidance_scale"] == 2.0
    assert json.loads(run.summary_file.read_text())["best"] == final
    assert f"best step {best} re-scored: fid" in out
    # `scalelong eval` of the run scores it on the captions it was scored on during training
    again = ["eval", str(run.path), "--n", "2", "--fid-stats", str(t2i_training.stats), "--device=cpu"]
    assert main([*again, "--no-progress"]) == 0, capsys.readouterr().err
    (scored,) = (run.path / "eval").iterdir()
    assert json.loads(scored.read_text())["captions_sampled"] == chosen[:2]


class ProcessShare:
    """Process ``rank`` of two, as the evaluation sees an Accelerate accelerator."""

    def __init__(self, rank: int):
        self.process_index, self.num_processes, self.is_main_process = rank, 2, rank == 0


def test_training_evaluation_gives_each_seed_the_same_caption_on_any_number_of_processes(
    t2i_run, monkeypatch
):
    import dataclasses

    import accelerate.utils

    import scalelong.training.t2i as t2i
    from scalelong.training.evaluation import (
        EVAL_SEED_OFFSET,
        TrainingEvaluator,
        choose_captions,
        read_caption_list,
    )
    from scalelong.training.runs import load_model

    cfg, captions, stats, _ = t2i_run
    cfg.eval = dataclasses.replace(
        cfg.eval, every=2, metric="fid", fid_stats=str(stats), captions=str(captions), num_samples=5
    )
    encoded = record_prompts(monkeypatch)
    drawn: dict[int, str] = {}  # seed -> the caption its sample showed
    generate = t2i.generate_from_context

    def recording(net, schedule, sampler, steps, seeds, *args, **kwargs):
        drawn.update(zip(seeds, encoded[-1], strict=True))
        return generate(net, schedule, sampler, steps, seeds, *args, **kwargs)

    monkeypatch.setattr(t2i, "generate_from_context", recording)
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda share: share)  # each keeps its own
    ema = load_model(cfg.run_dir / "checkpoints" / "step-000001", cfg.model, "ema")
    TrainingEvaluator(cfg, cfg.run_dir, "cpu")(2, ema)
    one_process = dict(drawn)
    for _ in range(2):  # the same captions at every evaluation
        drawn.clear()
        for rank in (1, 0):
            TrainingEvaluator(cfg, cfg.run_dir, "cpu", ProcessShare(rank))(2, ema)
        assert drawn == one_process
    base = cfg.train.seed * EVAL_SEED_OFFSET
    chosen = choose_captions(read_caption_list(captions), 5, base)
    assert [one_process[base + i] for i in range(5)] == chosen


def test_a_t2i_run_that_cannot_be_scored_is_refused_in_one_line_before_training(
    t2i_training, tmp_path, capsys
):
    argv = t2i_training.argv

    def without(prefix: str) -> list[str]:
        return [a for a in argv if not a.startswith(prefix)]

    def refused(args: list[str], match: str, run_dir=t2i_training.run_dir) -> None:
        rc = main(args)
        _, err = capsys.readouterr()
        assert rc == 2 and err.count("\n") == 1 and err.startswith("error: ") and match in err, err
        assert not run_dir.exists()  # nothing trained, nothing written

    refused(without("eval.captions="), match="eval.captions")
    not_coco = tmp_path / "plain.json"
    not_coco.write_text(json.dumps(["a cat", "a dog"]))
    refused([*argv, f"eval.captions={not_coco}"], match="annotations")
    refused([*argv, f"eval.captions={tmp_path / 'nowhere.json'}"], match="captions file not found")
    refused(without("eval.fid_stats="), match="eval.fid_stats")
    refused([*argv, f"eval.fid_stats={tmp_path / 'nowhere.npz'}"], match="reference statistics not found")
    wide = tmp_path / "wide.npz"
    np.savez(wide, mu=np.zeros(2048), sigma=np.eye(2048), metric=np.array("fid"), n=np.array(9))
    refused([*argv, f"eval.fid_stats={wide}"], match="2048")
    smaller = tmp_path / "coco_val_16.npz"
    fid = ["fid-stats", T2I_CONFIG, *TINY_T2I, "--images", str(t2i_training.images), "--center-crop=16"]
    assert main([*fid, "--device=cpu", "--no-progress", "--out", str(smaller)]) == 0
    capsys.readouterr()
    refused([*argv, f"eval.fid_stats={smaller}"], match="16x16")
    # the grid drawn at the end of training has no prompts: `scalelong sample RUN --prompt` draws them
    refused([*argv, "sample.num_images=4"], match="sample.num_images")
    digits = [
        "train",
        "configs/demo_uvit.yaml",
        f"out_dir={tmp_path / 'runs'}",
        "name=digits",
        "eval.every=2",
    ]
    refused(
        [*digits, f"eval.captions={t2i_training.captions}"], "text-to-image", tmp_path / "runs" / "digits"
    )


@pytest.mark.slow
def test_compare_of_t2i_methods_reads_their_training_evaluations(t2i_training, capsys):
    compare = ["compare", *t2i_training.argv[1:], "--methods", "none,ls"]
    assert main(compare) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ")]
    assert [cells[0].strip() for cells in rows[1:]] == ["none", "ls"]
    final_fd = [float(cells[1].split()[0]) for cells in rows[1:]]
    assert all(np.isfinite(final_fd)), out
    report = t2i_training.run_dir.parent / "t2i-compare"
    assert (report / "fd.png").is_file() and "Frechet distance (fid)" in (report / "report.md").read_text()
