"""The comparison report a person opens: its order, the enlarged sample grids, the self-contained
HTML, and (where Chromium is installed) that the page renders within a 1280-pixel window."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from scalelong.data import embedded_mnist
from scalelong.studies.compare import write_report
from scalelong.studies.report import final_sample_grid, markdown_html
from scalelong.studies.summary import StudyRun
from scalelong.training.config import load_config
from scalelong.training.train import save_grid

# One worker runs this module (`--dist loadgroup`): the study report is made once.
pytestmark = pytest.mark.xdist_group("test_report")

METHODS = ("none", "cs", "ls")


def records(method: str, seed: int) -> list[dict]:
    """What a run of ``method`` logs over 100 steps: loss, feature norm, evaluations with the digit
    score, the noise-level probe at the end and, for ls, six learned coefficients."""
    out = []
    for k in range(1, 11):
        r = {
            "step": 10 * k,
            "loss": 1.0 / k + 0.01 * seed,
            "feature_norm": 10.0 + k * (2 if method == "none" else 1),
        }
        if k % 5 == 0:
            r |= {
                "fd": 500.0 / k,
                "fd_metric": "fd-mnist",
                "digits/confident": 0.1 * k,
                "digits/entropy": 0.9,
            }
        if method == "ls":
            for i in range(1, 7):
                c = 0.3 + 0.08 * i + 0.01 * k
                r |= {f"skip/{i}/coef_mean": c, f"skip/{i}/coef_min": c - 0.1, f"skip/{i}/coef_max": c + 0.1}
        if k == 10:
            r |= {"noise/x0_mse_mean_image": 0.2, "noise/x0_mse@0.50": 0.1, "noise/eps_mse@0.50": 0.3}
        out.append(r)
    return out


def fake_run(folder: Path, method: str, seed: int, digits: torch.Tensor) -> StudyRun:
    """A run directory holding sample grids at steps 50 and 100 (the later one made of real digits)."""
    path = folder / f"{method}-seed{seed}"
    save_grid(-torch.ones(4, 1, 32, 32), path / "samples" / "step-000050.png")
    save_grid(digits, path / "samples" / "step-000100.png")
    return StudyRun(path.name, records(method, seed), {}, [], path=path, seed=seed)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("study")
    images = embedded_mnist("test")[0]
    studies = {
        m: [fake_run(folder / "runs", m, s, images[16 * j : 16 * j + 64]) for s in (0, 1)]
        for j, m in enumerate(METHODS)
    }
    base = load_config(None, ["model.uvit.depth=12", "train.steps=100"])
    path, table = write_report(studies, "none", folder / "report", base)
    assert "| confident digits (real 0.96) | class balance (real 1.00) |" in table
    return path.parent


def test_the_report_reads_table_samples_fig1_noise_levels_then_the_rest(report):
    md = (report / "report.md").read_text()
    markers = [
        "| method | final FD |",
        "## Samples",
        "![none, step 100](samples_none.png) ![cs, step 100](samples_cs.png) ![ls, step 100](samples_ls.png)",
        "## Fig. 1: hidden-feature norm",
        "(feature_norm.png)",
        "## Noise levels",
        "(noise_levels.png)",
        "## Training curves",
        "(fd.png)",
        "(digits.png)",
        "(loss.png)",
        "## Learned skip coefficients",
        "(coefficients_ls.png)",
    ]
    at = [md.find(m) for m in markers]
    assert -1 not in at, [m for m, i in zip(markers, at, strict=True) if i < 0]
    assert at == sorted(at)
    assert "of the seed-0 run (2 seeds were trained), enlarged 2x" in md
    assert "coefficients_none" not in md and "coefficients_cs" not in md  # constant methods: no figure


def test_sample_grids_are_the_last_ones_enlarged_with_whole_pixels(report, tmp_path):
    source = report.parent / "runs" / "cs-seed0" / "samples" / "step-000100.png"
    assert final_sample_grid(source.parent.parent) == (100, source)
    assert final_sample_grid(tmp_path) is None
    small = np.asarray(Image.open(source))
    big = np.asarray(Image.open(report / "samples_cs.png"))
    assert small.shape[:2] == (274, 274) and big.shape[:2] == (548, 548)  # 8 x 8 digits of 32 px, padded
    assert np.array_equal(big[::2, ::2], small) and np.array_equal(big[1::2, 1::2], small)  # nearest


def test_the_html_embeds_every_image_and_shows_the_grids_side_by_side(report):
    page = (report / "report.html").read_text()
    sources = re.findall(r'<img src="([^"]*)"', page)
    assert (
        len(sources) == 3 + 5 + 1
    )  # 3 grids, feature norm, noise levels, fd, digits, loss, the ls coefficients
    assert all(s.startswith("data:image/png;base64,") for s in sources)
    gallery = re.search(r"<div class='gallery'>(.*?)</div>", page).group(1)
    assert gallery.count("<figure>") == 3 and "<figcaption>cs, step 100</figcaption>" in gallery
    assert "<figcaption>training loss</figcaption>" in page


def test_markdown_html_keeps_single_images_as_figures(tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    page = markdown_html("# T\n\n![a caption](a.png)\n\n![a](a.png) ![b](a.png)\n", tmp_path, "T")
    assert page.count("<figure>") == 3 and page.count("class='gallery'") == 1
    assert "<figcaption>a caption</figcaption>" in page


def test_markdown_html_keeps_code_blocks_line_by_line(tmp_path):
    """The commands that made a study's runs, indented or fenced, stay one per line, escaped, and an
    indented line that continues a paragraph or a list item stays text."""
    md = (
        "The commands (runs each):\n\n"
        "    scalelong sweep a --lrs 1e-2  # 4\n    scalelong sweep b <x>  # 2\n\n"
        "```bash\nscalelong train demo\n\nmake test\n```\n"
        "A paragraph\n    that goes on.\n\n- an item\n    continued\n"
    )
    page = markdown_html(md, tmp_path, "T")
    blocks = re.findall(r"<pre><code>(.*?)</code></pre>", page, re.S)
    assert blocks == [
        "scalelong sweep a --lrs 1e-2  # 4\nscalelong sweep b &lt;x&gt;  # 2",
        "scalelong train demo\n\nmake test",
    ]
    assert "<p>A paragraph that goes on.</p>" in page


# ----------------------------------------------------------------------------- in a browser

CHECK = """<script>
window.addEventListener("load", () => {
  const images = Array.from(document.images);
  const out = document.createElement("pre");
  out.id = "layout-check";
  out.textContent = JSON.stringify({
    images: images.length,
    broken: images.filter((i) => !(i.complete && i.naturalWidth > 0)).map((i) => i.alt),
    scrollWidth: document.documentElement.scrollWidth,
  });
  document.body.appendChild(out);
});
</script>"""


def browser() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def rendered(page: Path, tmp_path: Path, width: int = 1280) -> dict:
    """Load a copy of ``page`` with a script that reports the loaded images and the page width."""
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text() + CHECK)
    command = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"]
    command += [f"--window-size={width},2000", f"--user-data-dir={tmp_path / 'profile'}", probe.as_uri()]
    dom = subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    found = re.search(r'<pre id="layout-check">(.*?)</pre>', dom)
    assert found, f"the check script did not run; the browser printed: {dom[-500:]!r}"
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.slow
@pytest.mark.skipif(browser() is None, reason="needs chromium (or chromium-browser) on PATH")
def test_the_report_renders_in_chromium_every_image_loads_and_fits_1280_px(report, tmp_path):
    result = rendered(report / "report.html", tmp_path)
    assert result["images"] == 9 and result["broken"] == []
    assert result["scrollWidth"] <= 1280, f"the page is {result['scrollWidth']} px wide at a 1280-px window"
