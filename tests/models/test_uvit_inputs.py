"""Bad arguments to UViT and SkipScaling give one ScaleLongError line that says what to pass, not a
raw TypeError, ZeroDivisionError or plain ValueError from deep inside torch."""

import pytest
import torch

from scalelong.errors import ScaleLongError
from scalelong.models import UViT
from scalelong.skips import SkipScaling

SHAPE = dict(img_size=8, patch_size=2, in_channels=1, embed_dim=16, depth=2, num_heads=2)


def uvit(**kwargs) -> UViT:
    torch.manual_seed(0)
    return UViT(**SHAPE, **kwargs).eval()


def batch(n: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 1, 8, 8, generator=g), torch.rand(n, generator=g) * 999


def one_line(info: pytest.ExceptionInfo) -> str:
    text = str(info.value)
    assert "\n" not in text
    return text


def test_a_class_conditional_uvit_without_labels_says_to_pass_y():
    model = uvit(num_classes=3)
    x, t = batch()
    assert model(x, t, torch.tensor([0, 2])).shape == x.shape
    with pytest.raises(ScaleLongError, match=r"^this UViT is class-conditional: pass labels y$") as info:
        model(x, t)
    one_line(info)


def test_a_text_conditional_uvit_without_context_says_to_pass_it_with_its_shape():
    model = uvit(context_dim=6, context_tokens=5)
    x, t = batch()
    assert model(x, t, context=torch.randn(2, 5, 6)).shape == x.shape
    with pytest.raises(ScaleLongError, match=r"text-conditional: pass context.*\(B, 5, 6\)") as info:
        model(x, t)
    one_line(info)
    both = uvit(num_classes=3, context_dim=6, context_tokens=5)  # label and text tokens
    with pytest.raises(ScaleLongError, match=r"pass context.*\(B, 5, 6\)"):
        both(x, t, torch.tensor([0, 1]))
    with pytest.raises(ScaleLongError, match="pass labels y"):
        both(x, t, context=torch.randn(2, 5, 6))


def test_conditions_the_model_was_not_built_for_are_refused_not_ignored():
    x, t = batch()
    labels, context = torch.tensor([0, 1]), torch.randn(2, 5, 6)
    for model in (uvit(), uvit(context_dim=6, context_tokens=5)):
        with pytest.raises(ScaleLongError, match=r"not class-conditional \(num_classes=0\).*num_classes > 0"):
            model(x, t, labels, **({"context": context} if model.context_embed is not None else {}))
    for model in (uvit(), uvit(num_classes=3)):
        with pytest.raises(ScaleLongError, match=r"not text-conditional \(context_dim=0\).*context_dim > 0"):
            model(x, t, labels if model.label_emb is not None else None, context=context)


@pytest.mark.parametrize("method", ["ls", "ls-nonshare", "none"])
def test_ls_reduction_must_be_an_integer_of_at_least_one(method):
    for reduction in (0, -4, 2.5, True):
        with pytest.raises(ScaleLongError, match=r"ls_reduction\) must be an integer >= 1") as info:
            uvit(skip_method=method, ls_reduction=reduction)
        one_line(info)
        with pytest.raises(ScaleLongError, match="must be an integer >= 1"):
            SkipScaling(method, 2, num_tokens=20, reduction=reduction)
        with pytest.raises(ScaleLongError, match="must be an integer >= 1"):
            SkipScaling(method, 2, skip_channels=[8, 16], reduction=reduction)
    model = uvit(skip_method=method, ls_reduction=1)  # 1 is allowed: full-width gates
    if method == "ls":
        assert model.skip_scaling.gates[0].excite[0].out_features == model.num_tokens
    x, t = batch()
    assert model(x, t).shape == x.shape


def test_an_unknown_skip_linear_init_names_the_accepted_values():
    accepted = r"^skip_linear_init='x'; choose one of release, xavier$"
    with pytest.raises(ScaleLongError, match=accepted) as info:
        uvit(skip_linear_init="x")
    one_line(info)
    with pytest.raises(ScaleLongError, match=r"skip_linear_skip_scale_init='x'; choose one of none, cs$"):
        uvit(skip_linear_skip_scale_init="x")
    with pytest.raises(ScaleLongError, match="scaled twice"):
        uvit(skip_method="cs", skip_linear_skip_scale_init="cs")
