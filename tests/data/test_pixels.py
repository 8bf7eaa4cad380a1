"""Images read from read-only buffers (memory-mapped npz batches, decoded PIL images) come out as
tensors of their own: no tensor wraps the read-only memory, so PyTorch never warns about it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from scalelong.data import UInt8Images, from_uint8, load_dataset


@pytest.fixture()
def warn_every_time():
    """PyTorch reports a non-writable NumPy array once per process; a test must see every case."""
    torch.set_warn_always(True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield
    torch.set_warn_always(False)


def assert_owned(image: torch.Tensor, again: torch.Tensor) -> None:
    """``image`` is contiguous float32 and writing into it leaves the dataset's next read alone."""
    assert image.dtype == torch.float32 and image.is_contiguous()
    kept = again.clone()
    image.fill_(7.0)
    torch.testing.assert_close(again, kept)


def test_memory_mapped_batches_give_tensors_of_their_own(tmp_path, warn_every_time):
    data = np.arange(4 * 12288, dtype=np.int64).astype(np.uint8).reshape(4, 12288)
    np.savez(tmp_path / "train_data_batch_1.npz", data=data, labels=np.array([1, 2, 3, 4]))
    ds = load_dataset("imagenet64", str(tmp_path))
    assert isinstance(ds.arrays[0], np.memmap) and not ds.arrays[0].flags.writeable  # the case at stake
    image, label = ds[1]
    expected = torch.from_numpy(data[1].reshape(3, 64, 64).astype(np.float32)) / 127.5 - 1
    assert torch.equal(image, expected) and int(label) == 1
    assert_owned(image, ds[1][0])
    assert_owned(ds[1][0], ds[1][0])


@pytest.mark.parametrize("channels", [1, 3])  # grey: the decoded array is already contiguous, not copied
def test_decoded_images_give_tensors_of_their_own(tmp_path, warn_every_time, channels):
    Image.new("RGB", (8, 6), (255, 0, 0)).save(tmp_path / "a.png")
    ds = load_dataset("folder", str(tmp_path), channels=channels)
    image, _ = ds[0]
    assert image.shape == (channels, 6, 8)
    value = 76 / 127.5 - 1 if channels == 1 else 1.0  # red as PIL's L: 76
    assert image[0].sub(value).abs().max() < 1e-6
    assert_owned(image, ds[0][0])


def test_read_only_and_transposed_pixels_convert_exactly(warn_every_time):
    pixels = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    pixels.flags.writeable = False
    for view in (pixels, pixels.transpose(2, 0, 1)):
        out = from_uint8(view)
        assert out.is_contiguous() and tuple(out.shape) == view.shape
        assert torch.equal(out, torch.tensor(view.tolist(), dtype=torch.float32).div(127.5).sub(1.0))
    labels = np.array([3, 1], dtype=np.int64)
    labels.flags.writeable = False
    ds = UInt8Images([pixels.reshape(2, 12)], labels, (3, 2, 2))
    ds.labels[0] = 5  # the dataset's own copy: writable, the caller's array untouched
    assert labels.tolist() == [3, 1]
