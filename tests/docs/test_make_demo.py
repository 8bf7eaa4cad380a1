"""``make demo`` computes what its recorded numbers were computed in: the Makefile's command, read
from the Makefile, trains and samples in bf16 where the CPU computes bf16 and in fp32 where it does
not (``auto``), never in bf16 emulated at a cost on a CPU without bf16 units."""

import re
import shlex

import pytest

from conftest import REPO
from scalelong.training import launch
from scalelong.training.config import load_config


def demo_command() -> tuple[str, list[str]]:
    """The preset and the ``key=value`` overrides of the Makefile's ``make demo``."""
    text = (REPO / "Makefile").read_text()
    args = re.search(r"^DEMO_ARGS\s*:=\s*((?:.*\\\n)*.*)$", text, re.M).group(1).replace("\\\n", " ")
    preset = re.search(r"scalelong compare (\w+) \$\(DEMO_ARGS\)", text).group(1)
    return preset, [w for w in shlex.split(args) if "=" in w and not w.startswith("-")]


@pytest.mark.parametrize("has_bf16, computes", [(True, "bf16"), (False, "no")])
def test_make_demo_trains_and_samples_in_bf16_only_where_the_cpu_computes_it(monkeypatch, has_bf16, computes):
    monkeypatch.setattr(launch, "cpu_has_bf16", lambda: has_bf16)
    preset, overrides = demo_command()
    assert preset == "demo" and "eval.num_samples=1000" in overrides  # the command was read
    cfg = load_config(REPO / "configs" / f"{preset}.yaml", overrides)
    assert launch.resolve_precision(str(cfg.train.mixed_precision), "cpu") == computes
    assert launch.resolve_precision(str(cfg.eval.mixed_precision), "cpu") == computes
