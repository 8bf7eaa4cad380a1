"""apply_scalelong on every backbone it serves: diffusers' UNets (UNet2DModel,
UNet2DConditionModel) and U-ViT (UTransformer2DModel, UniDiffuserModel), denoising-diffusion-pytorch's
Unet, and a network whose skips are declared; and save / load / describe on each.

Each test runs on every case of ``adapter_fixtures.CASES``; the skips are read off the real
model (what its encoder makes, what its decoder merges), never off the adapter's own layout.
"""

import copy
import json
import math

import pytest
import torch

from adapter_fixtures import CASES, case_params
from scalelong import describe, load_scalelong, save_scalelong
from scalelong.adapters import apply_scalelong, is_applied, remove_scalelong
from scalelong.diagnostics import Diagnostics, find_blocks
from scalelong.errors import ScaleLongError
from scalelong.skips import skip_table

pytestmark = pytest.mark.parametrize("name", case_params())


def applied(name: str, method: str, **kwargs):
    case = CASES[name]
    model = case.build()
    apply_scalelong(model, method, **{**case.declare(model), **kwargs})
    if case.watch is not None:
        model.scalelong.watch_blocks(case.watch(model))
    return case, model


def perturb(model, seed: int = 1) -> None:
    """Move the LS parameters away from their init, so copies and round trips are meaningful."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.scalelong.parameters():
            p.add_(torch.randn(p.shape, generator=gen))


def match(merged: torch.Tensor, dim: int, produced: list[torch.Tensor]) -> tuple[int, float]:
    """(1-based index, factor) of the one produced skip that the tail of ``merged`` is a multiple of."""
    found = []
    for i, p in enumerate(produced, start=1):
        n = p.shape[dim]
        if p.ndim != merged.ndim or merged.shape[dim] < n:
            continue
        tail = merged.narrow(dim, merged.shape[dim] - n, n).double()
        if tail.shape != p.shape:
            continue
        ref = p.double()
        factor = (tail * ref).sum() / ref.square().sum()
        if torch.linalg.vector_norm(tail - factor * ref) <= 1e-5 * torch.linalg.vector_norm(factor * ref):
            found.append((i, factor.item()))
    assert len(found) == 1, f"merged input matches {len(found)} produced skips"
    return found[0]


def test_cs_scales_skip_i_by_kappa_power_counted_from_the_outermost(name):
    kappa = 0.6
    case, model = applied(name, "cs", kappa=kappa)
    produced, merged, probed = [], [], {}
    case.producers(model, produced)
    case.consumers(model, merged)
    model.scalelong.probe = lambda i, skip, coef, out: probed.setdefault(i, []).append(coef)
    with torch.no_grad():
        case.run(model)
    n = case.num_skips
    assert model.scalelong.num_skips == n and len(produced) == n and len(merged) == n
    assert probed == {i: [kappa ** (i - 1)] for i in range(1, n + 1)}  # each skip once
    # the outermost skip is the first one the encoder makes (next to the input)
    indices = set()
    for tensor, dim in merged:
        index, factor = match(tensor, dim, produced)
        assert factor == pytest.approx(kappa ** (index - 1), rel=1e-5)
        indices.add(index)
    assert indices == set(range(1, n + 1))


def test_none_is_bit_identical_to_the_plain_model(name):
    case = CASES[name]
    plain = case.build()
    expected = case.run(plain)
    _, model = applied(name, "none")
    assert torch.equal(case.run(model), expected)


def test_remove_restores_outputs_and_state_dict_exactly(name):
    case = CASES[name]
    model = case.build()
    before, keys = case.run(model), set(model.state_dict())
    apply_scalelong(model, "ls-nonshare", reduction=4, **case.declare(model))
    perturb(model)
    assert is_applied(model) and not torch.equal(case.run(model), before)
    remove_scalelong(model)
    assert not is_applied(model) and not hasattr(model, "scalelong")
    assert torch.equal(case.run(model), before) and set(model.state_dict()) == keys
    apply_scalelong(model, "cs", **case.declare(model))  # can be applied again
    assert is_applied(model)


def test_deepcopy_ema_uses_its_own_parameters(name):
    case, model = applied(name, "ls-nonshare", reduction=4)
    before = case.run(model)
    ema = copy.deepcopy(model)
    refs = [m.__dict__["_scalelong_scaling"] for m in ema.modules() if "_scalelong_scaling" in m.__dict__]
    assert len(refs) >= 1 and all(r is ema.scalelong for r in refs)
    ema_modules = {id(m) for m in ema.modules()}
    assert all(id(b) in ema_modules for b in find_blocks(ema).values())  # diagnostics follow the copy
    assert torch.equal(case.run(ema), before)
    perturb(ema)
    assert not torch.allclose(case.run(ema), before)
    assert torch.equal(case.run(model), before)
    remove_scalelong(ema)  # the copy's hook handles remove the copy's hooks, never the original's
    assert is_applied(model) and not is_applied(ema) and torch.equal(case.run(model), before)


@pytest.mark.parametrize("method", ["ls", "ls-nonshare"])
def test_ls_parameters_sit_under_one_prefix_and_train(name, method):
    case, model = applied(name, method, reduction=4)
    model.train()
    ls = {k for k in model.state_dict() if "scalelong" in k}
    assert ls and all(k.startswith("scalelong.") for k in ls)
    assert ls == {f"scalelong.{k}" for k in model.scalelong.state_dict()}
    case.run(model).square().mean().backward()
    for gate in model.scalelong.gates:
        assert sum(p.grad.abs().sum() for p in gate.parameters()) > 0


def test_applying_twice_is_an_error(name):
    case, model = applied(name, "cs")
    with pytest.raises(ScaleLongError, match="already applied"):
        apply_scalelong(model, "ls", **case.declare(model))


def test_diagnostics_record_finite_norms_of_the_named_blocks(name):
    case, model = applied(name, "ls", reduction=4)
    model.train()
    diag = Diagnostics(model, every=1)
    assert diag.arm(0)
    case.run(model).square().mean().backward()
    record = diag.collect(0, 1.0)
    features = [k for k in record if k.startswith("block/") and k.endswith("/feature_norm")]
    assert features == [f"block/{b}/feature_norm" for b in case.blocks]
    for b in case.blocks:
        assert math.isfinite(record[f"block/{b}/feature_norm"]) and record[f"block/{b}/feature_norm"] > 0
        assert math.isfinite(record[f"block/{b}/grad_norm"])
    for i in range(1, case.num_skips + 1):
        assert 0 < record[f"skip/{i}/coef_min"] <= record[f"skip/{i}/coef_max"] < 1
    assert record["nonfinite_values"] == 0


@pytest.mark.parametrize("method", ["skip-norm", "merge-norm", "cs-init"])
def test_the_methods_beyond_the_paper_s_are_refused_whole(name, method):
    case = CASES[name]
    model = case.build()
    before, keys = case.run(model), list(model.state_dict())
    refusal = f"^apply_scalelong supports the methods .*; '{method}' is built"
    with pytest.raises(ScaleLongError, match=refusal):
        apply_scalelong(model, method, **case.declare(model))
    assert not is_applied(model) and not hasattr(model, "scalelong") and list(model.state_dict()) == keys
    assert torch.equal(case.run(model), before)


def test_moves_with_to(name):
    case, model = applied(name, "ls-nonshare", reduction=4)
    model.to(torch.float64)
    assert all(p.dtype == torch.float64 for p in model.scalelong.parameters())
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the case's inputs in float64 too
    try:
        assert case.run(model).dtype == torch.float64
    finally:
        torch.set_default_dtype(default)


@pytest.mark.parametrize("method", ["cs", "ls"])
def test_describe_lists_each_hooked_input_outermost_first(name, method):
    kappa = 0.6
    case, model = applied(name, method, kappa=kappa, reduction=4)
    rows = describe(model)
    assert [r.index for r in rows] == list(range(1, case.num_skips + 1))
    assert [r.shape for r in rows] == case.shapes
    for r in rows:  # the module a row names is the one that carries the hook, and its input exists
        assert "_scalelong_hook" in model.get_submodule(r.module).__dict__ and r.input
    if method == "cs":
        assert [r.coefficient for r in rows] == pytest.approx([kappa**i for i in range(case.num_skips)])
        assert all(r.gate is None for r in rows)
    else:
        assert all(r.coefficient is None and r.gate.endswith("(shared)") for r in rows)
    table = skip_table(model).splitlines()
    assert len(table) == case.num_skips + 3 and table[2].split()[0] == "1"
    assert f"{rows[0].module}({rows[0].input})" in table[2]


@pytest.mark.parametrize(("method", "kappa"), [("ls-nonshare", 0.8), ("cs", 0.7)])
def test_save_load_round_trip_gives_identical_outputs(name, method, kappa, tmp_path):
    case, model = applied(name, method, kappa=kappa, reduction=4)
    if method.startswith("ls"):
        perturb(model)
    expected, rows = case.run(model), describe(model)
    save_scalelong(model, tmp_path, save_model=False)
    meta = json.loads((tmp_path / "scalelong.json").read_text())
    assert all(isinstance(s["module"], str) for s in meta["declaration"]["skips"])  # the declaration as data
    fresh = case.build()
    assert load_scalelong(fresh, tmp_path) is fresh
    s = fresh.scalelong
    assert (s.method, s.kappa, s.reduction) == (method, kappa, 4)
    assert torch.equal(case.run(fresh), expected) and describe(fresh) == rows
    assert list(find_blocks(fresh)) == case.blocks  # the diagnostics' blocks come back too
    remove_scalelong(fresh)  # a replayed declaration is an ordinary application


@pytest.mark.parametrize("damage", ["flip", "truncate", "meta", "other-model", "shapes"])
def test_a_damaged_or_mismatched_file_is_one_line_and_changes_nothing(name, damage, tmp_path):
    case, model = applied(name, "ls", reduction=4)
    save_scalelong(model, tmp_path, save_model=False)
    weights, meta = tmp_path / "scalelong.safetensors", tmp_path / "scalelong.json"
    if damage == "flip":
        data = bytearray(weights.read_bytes())
        data[-3] ^= 0x10  # one bit of one gate parameter: still a valid file, another number
        weights.write_bytes(bytes(data))
    elif damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:40])
    elif damage == "meta":
        meta.write_text(meta.read_text()[:-20])
    elif damage == "other-model":  # a declaration that names a module this model does not have
        record = json.loads(meta.read_text())
        record["declaration"]["skips"][0]["module"] = "no.such.block"
        meta.write_text(json.dumps(record))
    else:  # one skip's shape gone: the checksum covers the weights only, the installer must refuse it
        record = json.loads(meta.read_text())
        del record["declaration"]["shapes"][-1]
        meta.write_text(json.dumps(record))
    fresh = case.build()
    before = case.run(fresh)
    with pytest.raises(ScaleLongError) as info:
        load_scalelong(fresh, tmp_path)
    assert "\n" not in str(info.value)
    assert not is_applied(fresh) and not hasattr(fresh, "scalelong")  # nothing half-applied
    assert torch.equal(case.run(fresh), before)
