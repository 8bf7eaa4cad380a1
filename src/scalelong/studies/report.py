"""A study's report: markdown with its images, and a self-contained HTML page of it; the sample
grids side by side, the captions of the plots, the digit-score columns and their legend."""

from __future__ import annotations

import base64
import html
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from scalelong.metrics.fd_mnist import CONFIDENT, real_digit_score
from scalelong.studies.summary import StudyRun
from scalelong.training.config import Config

DIGIT_HEADER = "confident digits"  # the first digit-score column of the study tables


def _embed(path: Path, caption: str = "") -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    caption = html.escape(caption or path.stem)
    img = f'<img src="data:image/png;base64,{data}" alt="{caption}">'
    return f"<figure>{img}<figcaption>{caption}</figcaption></figure>"


def _inline(text: str) -> str:
    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    text = re.sub(r"\*(.+?)\*", r"<i>\1</i>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)]+)\)")
_IMAGE_LINE = re.compile(r"^(?:!\[[^\]]*\]\([^)]+\)\s*)+$")

# Fits two 2x sample grids (548 px) side by side; tables wider than the page scroll in their box.
STYLE = (
    "body{font-family:sans-serif;max-width:1160px;margin:auto;padding:0 8px;line-height:1.4}"
    "td,th{border:1px solid #ccc;padding:4px 8px}table{border-collapse:collapse}"
    ".table{overflow-x:auto}img{max-width:100%}figure{margin:12px 0}"
    "figcaption{font-size:90%;color:#444}.gallery{display:flex;flex-wrap:wrap;gap:8px 12px}"
    ".gallery figure{margin:0}pre{background:#f6f6f6;padding:8px;overflow-x:auto}"
)


def markdown_html(md: str, folder: Path, title: str) -> str:
    """A self-contained HTML page of a report's markdown: headings, paragraphs, lists, tables,
    code blocks (fenced, or indented four spaces after a blank line), and its images
    (``![caption](file.png)`` in ``folder``) embedded, with the alt text as caption. A line of several
    images is a gallery: side by side, wrapping at the page width."""
    out, para, items, rows, code = [], [], [], [], []
    fenced = False

    def flush() -> None:
        if code:
            out.append(f"<pre><code>{html.escape(chr(10).join(code))}</code></pre>")
        if para:
            out.append(f"<p>{_inline(' '.join(para))}</p>")
        if items:
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + "</ul>")
        if rows:
            head = "".join(f"<th>{_inline(c)}</th>" for c in _cells(rows[0]))
            body = "".join(
                "<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in _cells(r)) + "</tr>" for r in rows[2:]
            )
            out.append(f"<div class='table'><table><tr>{head}</tr>{body}</table></div>")
        para.clear(), items.clear(), rows.clear(), code.clear()

    for line in md.splitlines():
        if line.startswith("```"):
            flush()
            fenced = not fenced
            continue
        if fenced or (line.startswith("    ") and not para and not items and (code or not rows)):
            code.append(line if fenced else line[4:])
            continue
        if code and line.strip():
            flush()
        heading = re.match(r"^(#{1,4}) (.*)", line)
        image = _IMAGE_LINE.match(line.strip())
        kind = "row" if line.startswith("|") else "item" if line.startswith("- ") else "text"
        if heading or image or not line.strip() or (kind != "row" and rows) or (kind != "item" and items):
            flush()
        if heading:
            n = len(heading.group(1))
            out.append(f"<h{n}>{_inline(heading.group(2))}</h{n}>")
        elif image:
            figures = [_embed(folder / name, alt) for alt, name in _IMAGE.findall(line)]
            out.append(figures[0] if len(figures) == 1 else f"<div class='gallery'>{''.join(figures)}</div>")
        elif kind == "row":
            rows.append(line)
        elif kind == "item":
            items.append(line[2:])
        elif line.strip():
            para.append(line.strip())
    flush()
    return (
        f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title><style>{STYLE}</style>"
        + "\n".join(out)
    )


def write_markdown_report(md: str, report_dir: Path, title: str) -> Path:
    """``report.md`` and its self-contained ``report.html`` in ``report_dir``; the path of report.md."""
    (report_dir / "report.md").write_text(md)
    (report_dir / "report.html").write_text(markdown_html(md, report_dir, title))
    return report_dir / "report.md"


def seeds_note(seeds: int) -> str:
    """The warning a report carries when its groups have fewer than 5 seeds."""
    return (
        f"**{seeds} seed(s) only:** on small models seed-to-seed noise is larger than the effect; "
        "use --seeds 5 or more before drawing a conclusion."
    )


def final_sample_grid(run_dir: str | Path) -> tuple[int, Path] | None:
    """The step and path of a run's last sample grid (``samples/step-XXXXXX.png``), None if it has none."""
    grids = []
    for path in (Path(run_dir) / "samples").glob("step-*.png"):
        step = path.stem.removeprefix("step-")
        if step.isdigit():
            grids.append((int(step), path))
    return max(grids, default=None)


def upscale(src: Path, dst: Path, min_width: int = 512, max_factor: int = 8) -> int:
    """Copy a PNG to ``dst`` enlarged by the smallest whole factor that makes it ``min_width`` wide,
    with nearest-neighbour pixels (a 32-pixel digit stays sharp); returns the factor."""
    from PIL import Image

    with Image.open(src) as image:
        factor = max(1, min(max_factor, math.ceil(min_width / image.width)))
        image.resize((image.width * factor, image.height * factor), Image.Resampling.NEAREST).save(dst)
    return factor


def sample_grid_section(
    studies: Mapping[str, Sequence[StudyRun]], report_dir: Path, base: Config
) -> list[str]:
    """The report's sample grids: each method's last grid of its first seed, side by side, enlarged."""
    shown, missing, factor = [], [], 1
    for method, runs in studies.items():
        found = final_sample_grid(runs[0].path) if runs and runs[0].path else None
        if found is None:
            missing.append(method)
            continue
        step, src = found
        dst = report_dir / f"samples_{re.sub(r'[^A-Za-z0-9_.-]', '_', method)}.png"
        factor = upscale(src, dst)
        shown.append(f"![{method}, step {step}]({dst.name})")
    if not shown:
        return ["## Samples", "The runs wrote no sample grids (sample.num_images is 0, or none finished)."]
    seeds = len(next(iter(studies.values())))
    which = f" of the seed-{base.train.seed} run ({seeds} seeds were trained)" if seeds > 1 else ""
    caption = (
        f"The last EMA sample grid of each method{which}, enlarged {factor}x with whole pixels. The same "
        "position starts from the same noise in every method, so the grids compare image by image."
    )
    if missing:
        caption += f" No grid: {', '.join(missing)}."
    return ["## Samples", caption, " ".join(shown)]


FIGURE_CAPTIONS = {
    "feature_norm": "**Fig. 1**: norm of the hidden features (mean over blocks) against step, mean over "
    "seeds. A norm that keeps growing, by decades on a log axis, is the instability long-skip scaling "
    "is meant to remove.",
    "magnitude": "The largest |value| each block's output reached over the run, the blocks in forward "
    "order (the encoder blocks' outputs are the long skips' inputs; each decoder block merges one), "
    "against fp16's largest value, 65,504 (dashed): where an fp16 run would overflow, and whether the "
    "skips or the decoder stream carry the large values.",
    "noise_levels": "Denoising error per noise level at each method's last measurement, on held-out "
    "images: x0 error (left; above the dashed error of the mean image a level is not learnt) and "
    "epsilon error (right).",
}


PLOT_CAPTIONS = {  # one line under each of the other plots
    "loss": "training loss",
    "fd": "Frechet distance ({metric}) of EMA samples at each evaluation",
    "digits": "digit score at each evaluation: confident digits (left), class balance (right); "
    "held-out real digits dashed",
    "grad_oscillation": "gradient norm of the blocks (left) and its sliding-window std (right)",
}


def plot_caption(stem: str, base: Config) -> str:
    """The one-line caption of a report plot (its file's stem) for a study of ``base``."""
    return PLOT_CAPTIONS.get(stem, stem).format(metric=base.eval.metric)


def has_digits(*columns: Sequence[float]) -> bool:
    """Whether any value of the digit-score columns is finite (the runs were evaluated with fd-mnist)."""
    return any(math.isfinite(v) for column in columns for v in column)


def digit_headers(real: Mapping | None = None) -> list[str]:
    """The headers of the two digit-score columns, with the real digits' values as the yardstick."""
    real = real_digit_score() if real is None else real
    return [f"{DIGIT_HEADER} (real {real['confident']:.2f})", f"class balance (real {real['entropy']:.2f})"]


def digit_legend(real: Mapping | None = None, markdown: bool = True) -> str:
    """One paragraph that says how to read the digit-score columns (``markdown`` False: plain text)."""
    real = real_digit_score() if real is None else real
    text = (
        f"**Digit score** of the samples of the last evaluation (beside FD, which mixes shape, stroke "
        f"width and class balance in one number): *confident digits* is the share of samples the "
        f"FD-MNIST classifier assigns to one class with p >= {CONFIDENT:g}; *class balance* is the "
        "entropy of the classes it assigns over log(10): 1 when every digit is equally frequent, 0 when "
        f"all samples are one digit. Held-out real digits score {real['confident']:.2f} and "
        f"{real['entropy']:.2f}; a few hundred samples of a perfect model read about 0.99 on balance."
    )
    return text if markdown else text.replace("*", "")
