"""U-ViT under CPU bf16 autocast: attention runs in fp32 (the CPU's bf16 attention kernels are slow)."""

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


def test_attention_runs_in_fp32_under_cpu_bf16_autocast(monkeypatch):
    model = _tiny()
    assert _attention_dtypes(monkeypatch, model, amp=True) == [torch.float32] * 3  # 2 blocks + the middle one
    assert _attention_dtypes(monkeypatch, model, amp=False) == [torch.float32] * 3


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
