"""Your images as an array file (data.name=array), the held-out split of a folder or an array,
and every bad input one error line."""

import zipfile

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from safetensors.numpy import save_file

from conftest import tiny_uvit_overrides
from scalelong.cli import main
from scalelong.data import load_dataset, split_heldout
from scalelong.errors import ScaleLongError
from scalelong.training.config import load_config
from scalelong.training.evaluation import probe_images


def pixels(n=6, c=3, side=8, seed=0) -> np.ndarray:
    """(N, C, H, W) uint8 with every image distinct."""
    return np.random.default_rng(seed).integers(0, 256, (n, c, side, side), dtype=np.uint8)


def expected(chw: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(chw.astype(np.float32)) / 127.5 - 1


def one_line_error(call, *words):
    with pytest.raises(ScaleLongError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message, message
    for word in words:
        assert word in message, (word, message)


@pytest.mark.parametrize(
    "layout",
    ["nchw.npy", "nhwc.npy", "nhw.npy", "nchw.npz", "nhwc-named.npz", "nchw.safetensors", "nhwc.safetensors"],
)
def test_every_accepted_layout_reads_the_same_images_in_order(tmp_path, layout):
    grey = layout.startswith("nhw.")
    chw = pixels(c=1 if grey else 3)
    stored = {"nchw": chw, "nhwc": chw.transpose(0, 2, 3, 1), "nhw": chw[:, 0]}[
        layout.split(".")[0].split("-")[0]
    ]
    file = tmp_path / layout
    if file.suffix == ".npy":
        np.save(file, stored)
    elif file.suffix == ".npz":
        arrays = {"images": stored, "other": np.zeros(3)} if "named" in layout else {"x": stored}
        np.savez(file, **arrays)
    else:
        save_file({"images": np.ascontiguousarray(stored)}, str(file))
    ds = load_dataset("array", str(file), split="all", channels=1 if grey else 3)
    assert len(ds) == 6
    for i in range(6):
        image, label = ds[i]
        assert torch.equal(image, expected(chw[i])) and int(label) == 0
    if file.suffix in (".npy", ".safetensors"):  # stored plainly: memory-mapped, not copied
        assert isinstance(ds.arrays[0], np.memmap) or isinstance(ds.arrays[0].base, np.memmap)


def test_a_folder_of_array_files_is_one_dataset_in_name_order(tmp_path):
    a, b = pixels(4, seed=1), pixels(3, seed=2)
    np.save(tmp_path / "part-01.npy", b)
    np.save(tmp_path / "part-00.npy", a)
    ds = load_dataset("array", str(tmp_path), split="all")
    assert len(ds) == 7 and "2 files in" in ds.description
    assert torch.equal(ds[0][0], expected(a[0])) and torch.equal(ds[4][0], expected(b[0]))


def test_bad_arrays_are_one_error_line(tmp_path):
    def load(name, **kw):
        return lambda: load_dataset("array", str(tmp_path / name), split="all", **kw)

    np.save(tmp_path / "float.npy", pixels().astype(np.float32) / 255)
    one_line_error(load("float.npy"), "float32 values, not uint8", "astype(np.uint8)")
    np.save(tmp_path / "cut.npy", pixels())
    data = (tmp_path / "cut.npy").read_bytes()
    (tmp_path / "cut.npy").write_bytes(data[: len(data) // 2])
    one_line_error(load("cut.npy"), "cut.npy is corrupt")
    (tmp_path / "garbage.npz").write_bytes(b"PK\x03\x04 not a zip")
    one_line_error(load("garbage.npz"), "garbage.npz is corrupt")
    save_file({"images": pixels()}, str(tmp_path / "cut.safetensors"))
    data = (tmp_path / "cut.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-50])
    one_line_error(load("cut.safetensors"), "cut.safetensors")
    save_file({"images": pixels().astype(np.float32)}, str(tmp_path / "float.safetensors"))
    one_line_error(load("float.safetensors"), "not uint8")
    np.savez(tmp_path / "two.npz", a=pixels(), b=pixels())
    one_line_error(load("two.npz"), "holds 2 arrays (a, b)", "'images'")
    np.save(tmp_path / "vector.npy", np.zeros((6, 64), np.uint8))
    one_line_error(load("vector.npy"), "shape (6, 64)", "(N, H, W), (N, H, W, C) or (N, C, H, W)")
    np.save(tmp_path / "ambiguous.npy", np.zeros((6, 3, 8, 3), np.uint8))
    one_line_error(load("ambiguous.npy"), "cannot be told apart")
    np.save(tmp_path / "rgba.npy", np.zeros((6, 8, 8, 4), np.uint8))
    one_line_error(load("rgba.npy"), "(6, 8, 8, 4)")
    one_line_error(load("rgb.npy"), "does not exist")
    np.save(tmp_path / "rgb.npy", pixels())
    one_line_error(load("rgb.npy", channels=1), "3-channel images but data.channels=1")
    (tmp_path / "notes.txt").write_text("x")
    one_line_error(load("notes.txt"), "not an array file")
    (tmp_path / "empty").mkdir()
    one_line_error(load("empty"), "no array files in")
    (tmp_path / "mixed").mkdir()
    np.save(tmp_path / "mixed" / "a.npy", pixels(c=3))
    np.save(tmp_path / "mixed" / "b.npy", pixels(c=1))
    one_line_error(load("mixed"), "b.npy holds images of shape (1, 8, 8) but", "a.npy of shape (3, 8, 8)")
    with zipfile.ZipFile(tmp_path / "empty.npz", "w"):
        pass
    one_line_error(load("empty.npz"), "holds 0 arrays")


def test_the_held_out_split_is_fixed_by_its_seed_and_excluded_from_training(tmp_path):
    np.save(tmp_path / "images.npy", pixels(20))
    parts = {
        s: load_dataset("array", str(tmp_path / "images.npy"), s, heldout=5)
        for s in ("train", "heldout", "all")
    }
    assert (len(parts["train"]), len(parts["heldout"]), len(parts["all"])) == (15, 5, 20)
    every = [parts["all"][i][0] for i in range(20)]

    def positions(part):
        return [next(j for j, e in enumerate(every) if torch.equal(e, part[i][0])) for i in range(len(part))]

    held, kept = positions(parts["heldout"]), positions(parts["train"])
    assert sorted(held + kept) == list(range(20)) and kept == sorted(
        kept
    )  # disjoint; training keeps its order
    again = load_dataset("array", str(tmp_path / "images.npy"), "heldout", heldout=5)
    assert positions(again) == held
    other = load_dataset("array", str(tmp_path / "images.npy"), "heldout", heldout=5, heldout_seed=1)
    assert positions(other) != held
    one_line_error(
        lambda: split_heldout(parts["all"], 20, 0, "train"), "data.heldout=20", "every one of the 20"
    )


def folder_run(tmp_path, n=12, side=16, *extra):
    images = tmp_path / "images"
    images.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(images / f"{i:02d}.png")
    return [
        *tiny_uvit_overrides("own", tmp_path / "runs", steps=2),
        "data.name=folder",
        f"data.path={images}",
        "model.uvit.in_channels=3",
        "model.uvit.img_size=16",
        "train.batch_size=4",
        "train.device=cpu",
        "train.tensorboard=false",
        "diagnostics.noise_levels=4",
        *extra,
    ]


def test_a_folder_run_records_its_held_out_images_and_is_measured_on_them(tmp_path, capsys):
    overrides = folder_run(tmp_path)
    assert main(["train", "configs/demo_uvit.yaml", *overrides, "--no-progress"]) == 0
    run = tmp_path / "runs" / "own"
    saved = yaml.safe_load((run / "config.yaml").read_text())["data"]
    assert saved["heldout"] == 4 and saved["heldout_seed"] == 0 and saved["split"] == "train"
    cfg = load_config(run / "config.yaml")
    images, _, held_out = probe_images(cfg, cfg.diagnostics.noise_levels)
    train = load_dataset("folder", cfg.data.path, heldout=4)
    every = load_dataset("folder", cfg.data.path, "all")
    assert held_out and len(images) == 4 and len(train) == 8
    trained = [train[i][0] for i in range(len(train))]
    for image in images:  # each probed image is one of the folder's, and none the run trained on
        assert any(torch.equal(image, every[i][0]) for i in range(len(every)))
        assert not any(torch.equal(image, t) for t in trained)
    records = (run / "metrics.jsonl").read_text()
    assert "noise/x0_mse@" in records


@pytest.mark.parametrize(
    "case, words",
    [
        ("non-image", ["notes.txt", "is not an image", "move them out"]),
        ("empty", ["no images found under"]),
        ("small", ["8x8 images, smaller than the 16x16 input of the model", "data.resolution"]),
        ("too-few", ["data.heldout=4 would hold out every one of the 4 images"]),
        ("heldout-elsewhere", ["data.heldout=3 applies to data.name=folder or array"]),
        ("array-dtype", ["float64 values, not uint8"]),
        ("array-resolution", ["array images are used at the size they are stored"]),
    ],
)
def test_every_bad_input_is_one_error_line_from_the_cli(tmp_path, capsys, case, words):
    overrides = folder_run(tmp_path, n=0 if case == "empty" else 4 if case == "too-few" else 12,
                           side=8 if case == "small" else 16)  # fmt: skip
    if case == "non-image":
        (tmp_path / "images" / "sub").mkdir()
        (tmp_path / "images" / "sub" / "notes.txt").write_text("not an image")
        (tmp_path / "images" / ".DS_Store").write_bytes(b"hidden files are fine")
    if case == "heldout-elsewhere":
        overrides += [
            "data.name=mnist",
            "data.heldout=3",
            "model.uvit.in_channels=1",
            "model.uvit.img_size=32",
        ]
    if case.startswith("array"):
        np.save(
            tmp_path / "x.npy", np.zeros((12, 16, 16, 3)) if case == "array-dtype" else pixels(12, side=16)
        )
        overrides += ["data.name=array", f"data.path={tmp_path / 'x.npy'}"]
        overrides += ["data.resolution=8"] if case == "array-resolution" else []
    assert main(["train", "configs/demo_uvit.yaml", *overrides, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err
    for word in words:
        assert word in err, (word, err)
    assert not (tmp_path / "runs").exists()


def test_an_array_trains_like_a_folder(tmp_path, capsys):
    np.save(
        tmp_path / "x.npy", pixels(12, side=16).transpose(0, 2, 3, 1)
    )  # channels last, as numpy keeps them
    overrides = [*folder_run(tmp_path, n=0), "data.name=array", f"data.path={tmp_path / 'x.npy'}"]
    assert main(["train", "configs/demo_uvit.yaml", *overrides, "--dry-run"]) == 0
    assert "images from" in capsys.readouterr().out
    assert main(["train", "configs/demo_uvit.yaml", *overrides, "--no-progress"]) == 0
    assert "final loss" in capsys.readouterr().out


@pytest.mark.parametrize("channels", [3, 1])
def test_a_folder_of_mixed_grey_rgb_and_rgba_files_reads_as_data_channels(tmp_path, channels):
    """Mixed channel counts are converted, not refused: grey copied, RGB to luminance, alpha dropped."""
    (tmp_path / "imgs").mkdir()
    Image.new("L", (8, 8), 100).save(tmp_path / "imgs" / "a.png")
    Image.new("RGB", (8, 8), (200, 100, 0)).save(tmp_path / "imgs" / "b.png")
    Image.new("RGBA", (8, 8), (0, 0, 250, 7)).save(tmp_path / "imgs" / "c.png")
    ds = load_dataset("folder", str(tmp_path / "imgs"), "all", channels=channels)
    images = torch.stack([ds[i][0] for i in range(3)])
    assert images.shape == (3, channels, 8, 8)
    pixel = ((images[:, :, 0, 0] + 1) * 127.5).round().int().tolist()  # back to 0..255
    grey_of = [round(0.299 * 200 + 0.587 * 100), round(0.114 * 250)]  # PIL's ITU-R 601-2 luma
    assert pixel == (
        [[100, 100, 100], [200, 100, 0], [0, 0, 250]] if channels == 3 else [[100], *([g] for g in grey_of)]
    )
