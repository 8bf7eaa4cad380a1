"""U-ViT under CPU bf16 autocast: attention as bf16 matrix products around an fp32 softmax (the CPU's
bf16 attention kernels are slow), close to the fp32 model."""

import torch
import torch.nn.functional as F

from scalelong.models import UViT


def _tiny() -> UViT:
    torch.manual_seed(0)
    return UViT(img_size=16, patch_size=4, in_channels=1, embed_dim=32, depth=2, num_heads=2, mlp_conv=True)


def _attention_dtypes(monkeypatch, model: UViT, amp: bool) -> list[torch.dtype]:
    seen, sdpa = [], F.scaled_dot_product_attention

    def watched(q, k, v, *args, **kwargs):
        seen.append(q.dtype)
        return sdpa(q, k, v, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", watched)
    x, t = torch.randn(2, 1, 16, 16), torch.tensor([10.0, 500.0])
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        model(x, t)
    return seen


def test_bf16_attention_avoids_the_cpu_sdpa_kernels_and_fp32_keeps_them(monkeypatch):
    model = _tiny()
    assert _attention_dtypes(monkeypatch, model, amp=True) == []  # bf16: the two matrix products
    assert _attention_dtypes(monkeypatch, model, amp=False) == [torch.float32] * 3  # 2 blocks + the middle


def test_bf16_attention_computes_softmax_attention():
    from scalelong.models.uvit import Attention

    torch.manual_seed(0)
    attn = Attention(32, 4)
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        ref = attn(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = attn(x)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), ref, rtol=0.05, atol=0.02)


def test_bf16_output_is_close_to_fp32():
    model = _tiny()
    x, t = torch.randn(4, 1, 16, 16), torch.tensor([1.0, 100.0, 500.0, 999.0])
    with torch.no_grad():
        ref = model(x, t)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(x, t)
    assert low.dtype == torch.bfloat16  # the final convolution runs in bf16 too
    rel = ((low.float() - ref).norm() / ref.norm()).item()
    assert 0 < rel < 3e-2, rel  # bf16 really ran (not bit-identical) and stays within bf16's precision
