import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from scalelong.adapters import load_uvit_checkpoint
from scalelong.errors import ScaleLongError
from scalelong.models import UViT
from scalelong.models.uvit import timestep_embedding
from scalelong.training.build import build_model, count_parameters, uvit_kwargs
from scalelong.training.config import ModelConfig, SkipConfig, UViTConfig

# A tiny U-ViT: img 8, patch 2 (16 patches), D 16, depth 2 (1 in, 1 mid, 1 out), 4 heads,
# class-conditional with 10 classes: L = 1 time + 1 label + 16 patches = 18 tokens.
TINY = UViTConfig(img_size=8, patch_size=2, in_channels=3, embed_dim=16, depth=2, num_heads=4, num_classes=10)


def released_state(seed: int = 0, depth: int = 2) -> dict[str, torch.Tensor]:
    """The release's names and shapes for TINY at ``depth``, written by hand (not taken from our model)."""
    D, p, C, L = 16, 2, 3, 18
    shapes = {
        "pos_embed": (1, L, D),
        "patch_embed.proj.weight": (D, C, p, p),
        "patch_embed.proj.bias": (D,),
        "label_emb.weight": (10, D),
        "norm.weight": (D,),
        "norm.bias": (D,),
        "decoder_pred.weight": (p * p * C, D),
        "decoder_pred.bias": (p * p * C,),
        "final_layer.weight": (C, C, 3, 3),
        "final_layer.bias": (C,),
    }
    half = depth // 2
    for i in range(half):
        shapes |= {f"out_blocks.{i}.skip_linear.weight": (D, 2 * D), f"out_blocks.{i}.skip_linear.bias": (D,)}
    blocks = (
        [f"in_blocks.{i}" for i in range(half)] + ["mid_block"] + [f"out_blocks.{i}" for i in range(half)]
    )
    for block in blocks:
        shapes |= {
            f"{block}.norm1.weight": (D,),
            f"{block}.norm1.bias": (D,),
            f"{block}.attn.qkv.weight": (3 * D, D),  # the release has no qkv bias
            f"{block}.attn.proj.weight": (D, D),
            f"{block}.attn.proj.bias": (D,),
            f"{block}.norm2.weight": (D,),
            f"{block}.norm2.bias": (D,),
            f"{block}.mlp.fc1.weight": (4 * D, D),
            f"{block}.mlp.fc1.bias": (4 * D,),
            f"{block}.mlp.fc2.weight": (D, 4 * D),
            f"{block}.mlp.fc2.bias": (D,),
        }
    gen = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=gen) for k, s in shapes.items()}


def test_loads_release_names_from_pth(tmp_path):
    state = released_state()
    torch.save(state, tmp_path / "nnet.pth")
    model = load_uvit_checkpoint(tmp_path / "nnet.pth", vars(TINY))
    into = UViT(**vars(TINY))
    assert load_uvit_checkpoint(tmp_path / "nnet.pth", into) is into  # or into a UViT of one's own
    assert all(torch.equal(into.state_dict()[k], v) for k, v in state.items())
    ours = model.state_dict()
    assert set(ours) == set(state)  # method none: no parameters of ours
    for k, v in state.items():
        assert torch.equal(ours[k], v), k
    x, t, y = torch.randn(2, 3, 8, 8), torch.rand(2) * 999, torch.tensor([1, 2])
    assert model(x, t, y).shape == x.shape


def test_safetensors_and_ls_keeps_its_init(tmp_path):
    state = released_state()
    save_file(state, tmp_path / "nnet.safetensors")
    cfg = ModelConfig(type="uvit", skip=SkipConfig(method="ls"), uvit=TINY)
    torch.manual_seed(3)
    fresh = UViT(**vars(TINY), skip_method="ls")
    torch.manual_seed(3)
    model = load_uvit_checkpoint(tmp_path / "nnet.safetensors", uvit_kwargs(cfg))
    assert model.skip_scaling.method == "ls"
    for (name, p), q in zip(
        model.skip_scaling.named_parameters(), fresh.skip_scaling.parameters(), strict=True
    ):
        assert torch.equal(p, q), name
    assert torch.equal(model.pos_embed, state["pos_embed"])


def test_clear_errors(tmp_path):
    with pytest.raises(ScaleLongError, match="not found"):
        load_uvit_checkpoint(tmp_path / "missing.pth", vars(TINY))

    state = released_state()
    state["pos_embed"] = torch.zeros(1, 17, 16)  # e.g. the checkpoint is unconditional
    torch.save(state, tmp_path / "shape.pth")
    with pytest.raises(ScaleLongError, match=r"pos_embed: checkpoint \(1, 17, 16\) vs model \(1, 18, 16\)"):
        load_uvit_checkpoint(tmp_path / "shape.pth", vars(TINY))

    state = released_state()
    del state["mid_block.mlp.fc2.bias"]
    state["extra.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / "keys.pth")
    with pytest.raises(
        ScaleLongError, match=r"missing 1: mid_block.mlp.fc2.bias.*unexpected 1: extra.weight"
    ):
        load_uvit_checkpoint(tmp_path / "keys.pth", vars(TINY))

    torch.save({"step": 3, "opt": object()}, tmp_path / "pickle.pth")  # not loadable with weights_only
    with pytest.raises(ScaleLongError, match="cannot read"):
        load_uvit_checkpoint(tmp_path / "pickle.pth", vars(TINY))
    with pytest.raises(ScaleLongError, match="a UViT or a dict of UViT arguments"):
        load_uvit_checkpoint(tmp_path / "keys.pth", 3)
    with pytest.raises(ScaleLongError, match="invalid U-ViT arguments"):
        load_uvit_checkpoint(tmp_path / "keys.pth", {"width": 3})


def tokens_entering_blocks(model: UViT, *args) -> torch.Tensor:
    """The (B, L, D) sequence the first in-block receives."""
    seen = []
    handle = model.in_blocks[0].register_forward_pre_hook(lambda m, inp: seen.append(inp[0]))
    with torch.no_grad():
        model(*args)
    handle.remove()
    return seen[0]


def test_token_order_follows_the_release():
    """Class-conditional: [label, time, patches]; text-conditional: [time, context, patches].

    The release (sail-sg/ScaleLong and baofff/U-ViT libs/uvit.py) prepends the label token
    after the time token; libs/uvit_t2i.py concatenates (time, context, patches).
    """
    torch.manual_seed(0)
    x, t, y = torch.randn(2, 3, 8, 8), torch.tensor([3.0, 700.0]), torch.tensor([1, 2])
    model = UViT(**vars(TINY)).eval()
    seq = tokens_entering_blocks(model, x, t, y)
    pos = model.pos_embed[0]
    with torch.no_grad():
        torch.testing.assert_close(seq[:, 0], model.label_emb(y) + pos[0])
        torch.testing.assert_close(seq[:, 1], timestep_embedding(t, 16) + pos[1])
        torch.testing.assert_close(seq[:, 2:], model.patch_embed(x) + pos[2:])

    t2i = UViT(**{**vars(TINY), "num_classes": 0, "context_dim": 6, "context_tokens": 3}).eval()
    context = torch.randn(2, 3, 6)
    seq = tokens_entering_blocks(t2i, x, t, None, context)
    pos = t2i.pos_embed[0]
    with torch.no_grad():
        torch.testing.assert_close(seq[:, 0], timestep_embedding(t, 16) + pos[0])
        torch.testing.assert_close(seq[:, 1:4], t2i.context_embed(context) + pos[1:4])
        torch.testing.assert_close(seq[:, 4:], t2i.patch_embed(x) + pos[4:])


def test_mlp_time_embed_has_the_release_layout_and_loads(tmp_path):
    """mlp_time_embed=True: time token = Linear(D, 4D) -> SiLU -> Linear(4D, D) of the sinusoid."""
    D = 16
    cfg = ModelConfig(type="uvit", uvit=UViTConfig(**{**vars(TINY), "mlp_time_embed": True}))
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    extra = {k: tuple(v.shape) for k, v in model.state_dict().items() if k not in released_state()}
    assert extra == {
        "time_embed.0.weight": (4 * D, D),
        "time_embed.0.bias": (4 * D,),
        "time_embed.2.weight": (D, 4 * D),
        "time_embed.2.bias": (D,),
    }
    assert count_parameters(model) - count_parameters(UViT(**vars(TINY))) == 8 * D * D + 5 * D
    assert UViTConfig().mlp_time_embed is False  # the release's configs

    x, t, y = torch.randn(2, 3, 8, 8), torch.tensor([3.0, 700.0]), torch.tensor([1, 2])
    seq = tokens_entering_blocks(model, x, t, y)
    with torch.no_grad():
        expected = model.time_embed[2](F.silu(model.time_embed[0](timestep_embedding(t, D))))
        torch.testing.assert_close(seq[:, 1], expected + model.pos_embed[0, 1])

    state = released_state() | {k: torch.randn(s) for k, s in extra.items()}
    torch.save(state, tmp_path / "mlp_time.pth")
    loaded = load_uvit_checkpoint(tmp_path / "mlp_time.pth", uvit_kwargs(cfg))
    assert torch.equal(loaded.time_embed[0].weight, state["time_embed.0.weight"])
    with pytest.raises(ScaleLongError, match=r"unexpected 4: time_embed\.0\.weight.*mlp_time_embed"):
        load_uvit_checkpoint(tmp_path / "mlp_time.pth", vars(TINY))


def release_gate(prefix: str, gen: torch.Generator, L: int = 18, r: int = 16) -> dict[str, torch.Tensor]:
    """One LS gate as the release stores it: layer1 = Linear(L, L // r), layer2 = Linear(L // r, L)."""
    shapes = {
        "layer1.weight": (L // r, L),
        "layer1.bias": (L // r,),
        "layer2.weight": (L, L // r),
        "layer2.bias": (L,),
    }
    return {f"{prefix}{k}": torch.randn(s, generator=gen) for k, s in shapes.items()}


def release_coefficient(state: dict[str, torch.Tensor], prefix: str, skip: torch.Tensor) -> torch.Tensor:
    """The release's LS coefficient: sigmoid(layer2(relu(layer1(mean over channels)))), shape (B, L, 1)."""
    h = torch.relu(F.linear(skip.mean(-1), state[f"{prefix}layer1.weight"], state[f"{prefix}layer1.bias"]))
    return torch.sigmoid(F.linear(h, state[f"{prefix}layer2.weight"], state[f"{prefix}layer2.bias"]))[
        ..., None
    ]


DEEP = UViTConfig(**{**vars(TINY), "depth": 6})  # 3 skips


def test_release_ls_gates_are_loaded(tmp_path):
    """scalelong=3 stores se.layer{1,2}.*; scalelong=4 stores se.{k}.layer{1,2}.* for the k-th
    out-block, which merges skip N - k (k = 0: the innermost skip, our index N = 3)."""
    gen = torch.Generator().manual_seed(1)
    skip = torch.randn(2, 18, 16, generator=gen)

    shared = released_state(depth=6) | release_gate("se.", gen)
    torch.save(shared, tmp_path / "ls.pth")
    cfg = ModelConfig(type="uvit", skip=SkipConfig(method="ls"), uvit=DEEP)
    model = load_uvit_checkpoint(tmp_path / "ls.pth", uvit_kwargs(cfg))
    for index in (1, 2, 3):
        with torch.no_grad():
            coef = model.skip_scaling.gate_for(index)(skip)
        torch.testing.assert_close(coef, release_coefficient(shared, "se.", skip))

    per_skip = released_state(depth=6)
    for k in range(3):
        per_skip |= release_gate(f"se.{k}.", gen)
    torch.save(per_skip, tmp_path / "ls_nonshare.pth")
    cfg = ModelConfig(type="uvit", skip=SkipConfig(method="ls-nonshare"), uvit=DEEP)
    model = load_uvit_checkpoint(tmp_path / "ls_nonshare.pth", uvit_kwargs(cfg))
    for k in range(3):
        with torch.no_grad():
            coef = model.skip_scaling.gate_for(3 - k)(skip)
        torch.testing.assert_close(coef, release_coefficient(per_skip, f"se.{k}.", skip))


def test_no_tensor_is_dropped_silently(tmp_path):
    gen = torch.Generator().manual_seed(2)
    shared = released_state(depth=6) | release_gate("se.", gen)
    torch.save(shared, tmp_path / "ls.pth")
    per_skip = released_state(depth=6)
    for k in range(4):  # one gate more than the model's 3 skips
        per_skip |= release_gate(f"se.{k}.", gen)
    torch.save(per_skip, tmp_path / "ls4.pth")

    def cfg(method):
        return ModelConfig(type="uvit", skip=SkipConfig(method=method), uvit=DEEP)

    for strict in (True, False):  # gates of another method are never ignored
        with pytest.raises(
            ScaleLongError, match=r"scalelong=3.*skip method is 'none'.*build the UViT with skip_method='ls'"
        ):
            load_uvit_checkpoint(tmp_path / "ls.pth", uvit_kwargs(cfg("none")), strict=strict)
        with pytest.raises(
            ScaleLongError, match=r"scalelong=4.*skip method is 'ls'.*skip_method='ls-nonshare'"
        ):
            load_uvit_checkpoint(tmp_path / "ls4.pth", uvit_kwargs(cfg("ls")), strict=strict)
    with pytest.raises(ScaleLongError, match=r"unexpected 4: se\.3\.layer1\.weight, se\.3\.layer1\.bias"):
        load_uvit_checkpoint(tmp_path / "ls4.pth", uvit_kwargs(cfg("ls-nonshare")))
    with pytest.warns(UserWarning, match=r"ignored 4: se\.3\.layer1\.weight"):
        model = load_uvit_checkpoint(tmp_path / "ls4.pth", uvit_kwargs(cfg("ls-nonshare")), strict=False)
    assert torch.equal(model.skip_scaling.gate_for(1).excite[0].weight, per_skip["se.2.layer1.weight"])

    # A state dict of our own (skip_scaling.*) loads as it is, gates included.
    torch.manual_seed(4)
    ours = UViT(**vars(DEEP), skip_method="ls-nonshare").state_dict()
    save_file(ours, tmp_path / "ours.safetensors")
    loaded = load_uvit_checkpoint(tmp_path / "ours.safetensors", uvit_kwargs(cfg("ls-nonshare"))).state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in ours.items())
    partial = {k: v for k, v in ours.items() if k != "skip_scaling.gates.2.excite.2.bias"}
    save_file(partial, tmp_path / "partial.safetensors")
    with pytest.raises(ScaleLongError, match=r"missing 1: skip_scaling\.gates\.2\.excite\.2\.bias"):
        load_uvit_checkpoint(tmp_path / "partial.safetensors", uvit_kwargs(cfg("ls-nonshare")))
