"""Dataset layouts, built as tiny fakes on the fly: each loads with the right pixels and labels;
a wrong path and a damaged file each give a one-line error naming what was expected."""

import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import tiny_uvit_overrides
from scalelong.cli import main
from scalelong.data import UInt8Images, describe, load_dataset
from scalelong.errors import ScaleLongError


def write_cifar(folder, per_batch: int = 4) -> np.ndarray:
    """Fake python batches; returns the rows of data_batch_1."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    first = None
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        batch = {b"data": data, b"labels": [i % 10 for i in range(per_batch)], b"batch_label": name.encode()}
        (folder / name).write_bytes(pickle.dumps(batch))
        first = data if first is None else first
    return first


def one_line_error(fn, *words):
    with pytest.raises(ScaleLongError) as info:
        fn()
    message = str(info.value)
    assert "\n" not in message, message
    for word in words:
        assert word in message, message
    return message


def test_cifar10_both_layouts_pixels_and_labels(tmp_path):
    rows = write_cifar(tmp_path / "cifar-10-batches-py")
    for path in (tmp_path, tmp_path / "cifar-10-batches-py"):
        ds = load_dataset("cifar10", str(path))
        assert len(ds) == 20 and isinstance(ds, UInt8Images)
        image, label = ds[1]
        assert image.shape == (3, 32, 32) and image.dtype == torch.float32 and label == 1
        # row layout: 1024 red, 1024 green, 1024 blue, each row-major
        assert image[1, 2, 3] == pytest.approx(rows[1, 1024 + 2 * 32 + 3] / 127.5 - 1)
    assert len(load_dataset("cifar10", str(tmp_path), "test")) == 4
    assert "CIFAR-10 train" in describe(load_dataset("cifar10", str(tmp_path)))


def test_celeba64_crops_the_uvit_box(tmp_path):
    folder = tmp_path / "img_align_celeba"
    folder.mkdir()
    for i in range(4):
        img = Image.new("RGB", (178, 218), (255, 0, 0))  # outside the box: red
        img.paste((0, 0, 255), (25, 57, 153, 185))  # the 128x128 box around (89, 121): blue
        img.save(folder / f"{i + 1:06d}.png")
    (tmp_path / "list_eval_partition.txt").write_text(
        "000001.png 0\n000002.png 0\n000003.png 0\n000004.png 1\n"
    )
    ds = load_dataset("celeba64", str(tmp_path))
    assert len(ds) == 3 and len(load_dataset("celeba64", str(folder), "valid")) == 1
    image, _ = ds[0]
    assert image.shape == (3, 64, 64)
    assert torch.allclose(image[2], torch.ones(64, 64)) and torch.allclose(image[0], -torch.ones(64, 64))
    assert len(load_dataset("celeba64", str(folder), "all")) == 4
    Image.new("RGB", (100, 100)).save(folder / "000001.png")  # not an aligned image
    one_line_error(lambda: ds[0], "000001.png", "178x218")
    (tmp_path / "list_eval_partition.txt").unlink()
    one_line_error(
        lambda: load_dataset("celeba64", str(tmp_path)), "list_eval_partition.txt", "data.split=all"
    )


def test_imagenet64_npz_batches_memory_mapped_or_compressed(tmp_path):
    rng = np.random.default_rng(1)
    data1 = rng.integers(0, 256, (5, 12288), dtype=np.uint8)
    data2 = rng.integers(0, 256, (3, 12288), dtype=np.uint8)
    np.savez(tmp_path / "train_data_batch_1.npz", data=data1, labels=np.array([1, 2, 3, 1000, 5]))
    np.savez_compressed(tmp_path / "train_data_batch_2.npz", data=data2, labels=np.array([7, 8, 9]))
    ds = load_dataset("imagenet64", str(tmp_path))
    assert len(ds) == 8 and isinstance(ds.arrays[0], np.memmap) and not isinstance(ds.arrays[1], np.memmap)
    assert ds.labels.tolist() == [0, 1, 2, 999, 4, 6, 7, 8]  # files count classes from 1
    image, label = ds[6]
    assert image.shape == (3, 64, 64) and label == 7
    assert image[2, 5, 7] == pytest.approx(data2[1, 2 * 4096 + 5 * 64 + 7] / 127.5 - 1)
    one_line_error(lambda: load_dataset("imagenet64", str(tmp_path), channels=1), "data.channels=1", "RGB")
    np.savez(tmp_path / "val_data.npz", data=data2, labels=np.array([0, 1, 2]))  # labels out of 1..1000
    one_line_error(lambda: load_dataset("imagenet64", str(tmp_path), "val"), "val_data.npz", "1..1000")


def test_imagenet64_class_folders_and_plain_folder(tmp_path):
    for c, color in (("n001", (255, 0, 0)), ("n002", (0, 255, 0))):
        (tmp_path / "train" / c).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (100, 80), color).save(tmp_path / "train" / c / f"{i}.png")
    ds = load_dataset("imagenet64", str(tmp_path))
    assert len(ds) == 4 and ds.labels.tolist() == [0, 0, 1, 1]
    image, label = ds[2]
    assert image.shape == (3, 64, 64) and label == 1 and image[1].mean() == pytest.approx(1.0)
    grey, label = load_dataset("imagenet64", str(tmp_path), channels=1)[2]  # green as PIL's L: 150
    assert grey.shape == (1, 64, 64) and label == 1 and grey.mean() == pytest.approx(150 / 127.5 - 1)
    folder = load_dataset("folder", str(tmp_path))  # any folder: recursive, native size, label 0
    assert len(folder) == 4 and folder[0][0].shape == (3, 80, 100) and int(folder[3][1]) == 0
    assert load_dataset("folder", str(tmp_path), resolution=16)[0][0].shape == (3, 16, 16)
    Image.new("RGB", (50, 50)).save(tmp_path / "train" / "n002" / "small.png")
    one_line_error(lambda: load_dataset("folder", str(tmp_path))[4], "small.png", "data.resolution")


def test_embedded_mnist_default():
    ds = load_dataset("mnist")
    assert len(ds) == 4000 and ds[0][0].shape == (1, 32, 32)
    assert "MNIST" in describe(ds)


@pytest.mark.parametrize(
    "name, words",
    [
        ("cifar10", ["data_batch_1..5", "cifar-10-batches-py"]),
        ("celeba64", ["img_align_celeba", "178x218"]),
        ("imagenet64", ["train_data_batch_1..10", "subfolder per class"]),
        ("folder", ["folder of images"]),
    ],
)
def test_wrong_path_names_the_expected_layout(tmp_path, name, words):
    one_line_error(lambda: load_dataset(name, str(tmp_path / "nowhere")), str(tmp_path / "nowhere"), *words)
    one_line_error(lambda: load_dataset(name, str(tmp_path)), *words)  # exists, but empty


def test_corrupt_files_are_named(tmp_path):
    write_cifar(tmp_path / "cifar")
    (tmp_path / "cifar" / "data_batch_3").write_bytes(b"\x80\x04 not a pickle")
    one_line_error(lambda: load_dataset("cifar10", str(tmp_path / "cifar")), "data_batch_3", "corrupt")
    (tmp_path / "npz").mkdir()
    (tmp_path / "npz" / "train_data_batch_1.npz").write_bytes(b"PK\x03\x04 truncated")
    one_line_error(lambda: load_dataset("imagenet64", str(tmp_path / "npz")), "train_data_batch_1.npz")


def image_folder_run(tmp_path, steps: int = 2) -> tuple[list[str], object]:
    """Four 16x16 images and the overrides of a tiny run on them."""
    images = tmp_path / "images"
    images.mkdir()
    for i in range(4):
        Image.new("RGB", (16, 16), (i * 60, 0, 0)).save(images / f"{i}.png")
    overrides = tiny_uvit_overrides("corrupt", tmp_path / "runs", steps=steps) + [
        "data.name=folder",
        f"data.path={images}",
        "data.heldout=0",  # four images: none to spare for the noise-level probe
        "data.num_workers=1",
        "model.uvit.in_channels=3",
        "model.uvit.img_size=16",
        "train.batch_size=4",
        "train.device=cpu",
        "train.tensorboard=false",
    ]
    return overrides, images


def test_a_corrupt_image_stops_the_run_before_it_starts(tmp_path, capsys):
    overrides, images = image_folder_run(tmp_path)
    (images / "2.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    (images / "sub").mkdir()
    (images / "sub" / "9.png").write_bytes((images / "0.png").read_bytes()[:40])  # truncated
    code = main(["train", "configs/demo_uvit.yaml", *overrides, "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.count("\n") == 1 and "corrupt or unreadable image" in err and "2.png" in err
    assert "1 more of the 5 images" in err
    assert not (tmp_path / "runs").exists()  # found before the run directory is made


def test_an_image_damaged_during_the_run_is_one_line_from_a_loader_worker(tmp_path):
    from scalelong.training.config import load_config
    from scalelong.training.train import train

    overrides, images = image_folder_run(tmp_path, steps=12)

    def damage(step, trainer):
        if step == 1:
            (images / "3.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")

    with pytest.raises(ScaleLongError) as info:
        train(load_config("configs/demo_uvit.yaml", overrides), progress=False, step_hooks=[damage])
    message = str(info.value)
    assert "\n" not in message and "corrupt or unreadable image" in message and "3.png" in message


def test_dry_run_prints_config_model_and_data(tmp_path, capsys):
    write_cifar(tmp_path / "cifar-10-batches-py")
    argv = ["train", "configs/cifar10_uvit_s2.yaml", f"data.path={tmp_path}", "--dry-run"]
    assert main(argv) == 2  # the recipe's batch of 128 is more than the 20 images
    assert "fewer than one batch of train.batch_size=128" in capsys.readouterr().err
    code = main([*argv, "train.batch_size=16"])
    out = capsys.readouterr().out
    assert code == 0
    assert "44,255,328 parameters" in out and "coefficient" in out
    assert "data: CIFAR-10 train from" in out and "20 images" in out and "(3, 32, 32)" in out
    assert not (tmp_path / "runs").exists()


def test_grey_image_folder_loads_with_one_channel_and_trains(tmp_path, capsys):
    """data.channels=1 reads grey PNGs as 1-channel images (no RGB copy); 3 keeps RGB; a value the
    model does not take is one line before any data is read."""
    from scalelong.training.config import load_config

    images = tmp_path / "grey"
    images.mkdir()
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (8, 16, 16), dtype=np.uint8)
    for i, array in enumerate(pixels):
        Image.fromarray(array, mode="L").save(images / f"{i}.png")
    Image.fromarray(np.full((16, 16, 3), (255, 0, 0), np.uint8)).save(images / "8.png")  # a colour file

    grey = load_dataset("folder", str(images), channels=1)
    assert len(grey) == 9 and "grey images" in describe(grey)
    for i in (0, 7):
        image = grey[i][0]
        assert image.shape == (1, 16, 16) and image.dtype == torch.float32
        assert torch.equal(image[0], torch.from_numpy(pixels[i]).float() / 127.5 - 1)
    assert grey[8][0].shape == (1, 16, 16)  # colour files are converted to grey (PIL's L)
    assert load_dataset("folder", str(images), resolution=8, channels=1)[0][0].shape == (1, 8, 8)
    rgb = load_dataset("folder", str(images))[0][0]  # the default: RGB, three equal channels
    assert rgb.shape == (3, 16, 16) and torch.equal(rgb[0], rgb[2])

    base = [*tiny_uvit_overrides("grey", tmp_path / "runs", steps=2), "data.name=folder", "data.heldout=0"]
    base += [f"data.path={images}", "model.uvit.img_size=16", "train.batch_size=4", "train.device=cpu"]
    for extra, words in (
        (["model.uvit.in_channels=1"], ["data.channels=3", "model.uvit.in_channels=1", "data.channels=1"]),
        (["data.channels=1", "model.uvit.in_channels=3"], ["data.channels=1", "as grey"]),
        (["data.channels=2", "model.uvit.in_channels=1"], ["data.channels must be 3 (RGB) or 1 (grey)"]),
    ):
        one_line_error(lambda extra=extra: load_config("configs/demo_uvit.yaml", base + extra), *words)

    overrides = [*base, "data.channels=1", "model.uvit.in_channels=1", "train.tensorboard=false"]
    assert main(["train", "configs/demo_uvit.yaml", *overrides, "--no-progress"]) == 0
    assert "final loss" in capsys.readouterr().out
    assert load_config(tmp_path / "runs" / "grey" / "config.yaml").data.channels == 1


class _Exploit:
    """Unpickling this calls ``os.system`` (a crafted pickle can name any function)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("where", ["top", "data", "labels"])
def test_a_crafted_cifar_batch_is_refused_and_runs_no_code(tmp_path, capsys, where):
    write_cifar(tmp_path / "cifar")
    marker = tmp_path / "code-ran"
    batch = {b"data": np.zeros((4, 3072), np.uint8), b"labels": [0, 1, 2, 3]}
    if where == "top":
        batch = _Exploit(marker)
    else:
        batch[f"{where}".encode()] = _Exploit(marker)
    (tmp_path / "cifar" / "data_batch_2").write_bytes(pickle.dumps(batch, protocol=2))
    assert pickle.loads(pickle.dumps(_Exploit(tmp_path / "probe"))) == 0  # the payload works
    assert (tmp_path / "probe").exists()
    message = one_line_error(lambda: load_dataset("cifar10", str(tmp_path / "cifar")), "data_batch_2")
    assert "system" in message and "not loaded" in message
    assert not marker.exists()
    # the same through the command line: --dry-run, one line, exit 2, nothing ran, nothing made
    code = main(["train", "configs/cifar10_uvit_s2.yaml", f"data.path={tmp_path / 'cifar'}", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "data_batch_2" in err and "Traceback" not in err
    assert not marker.exists() and not (tmp_path / "runs").exists()


def test_cifar_object_arrays_are_refused(tmp_path):
    write_cifar(tmp_path / "cifar")
    batch = {b"data": np.array([object()] * 3072, dtype=object).reshape(1, 3072), b"labels": [0]}
    (tmp_path / "cifar" / "data_batch_1").write_bytes(pickle.dumps(batch))
    one_line_error(lambda: load_dataset("cifar10", str(tmp_path / "cifar")), "Python objects")


@pytest.mark.parametrize("protocol", [2, 5])
def test_cifar_batches_of_every_pickle_flavour_load(tmp_path, protocol):
    """Python 3 pickles at protocols 2 and 5, and the numpy 1 names of the official files."""
    write_cifar(tmp_path / "cifar")
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, (4, 3072), dtype=np.uint8)
    raw = pickle.dumps({b"data": data, b"labels": [3, 1, 4, 1], b"filenames": [b"a.png"] * 4}, protocol)
    if protocol == 2:  # as numpy 1 wrote them: numpy.core.multiarray._reconstruct
        assert b"numpy._core.multiarray" in raw
        raw = raw.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    (tmp_path / "cifar" / "data_batch_1").write_bytes(raw)
    ds = load_dataset("cifar10", str(tmp_path / "cifar"))
    assert ds.labels[:4].tolist() == [3, 1, 4, 1]
    assert torch.equal(ds[0][0], torch.from_numpy(data[0].reshape(3, 32, 32)).float() / 127.5 - 1)
