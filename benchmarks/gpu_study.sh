#!/usr/bin/env bash
# Studies at the release's width on one GPU in 10 minutes, each one `scalelong sweep` folder with its
# report. STUDY=basin (the default): the lr basin (Wortsman et al. 2023, arXiv 2309.14322) of none, cs
# and a normalisation arm at 3 lrs around the edge, on the stability preset's constant-lr recipe.
# STUDY=depth: the paper's Fig. 1 (hidden-feature norm against step, one line per skip method) for
# U-ViTs of depth 12 and 24 on the demo recipe, plus the stability map.
#
#   bash benchmarks/gpu_study.sh                    # the lr basin (needs CUDA)
#   bash benchmarks/gpu_study.sh --dry-run          # check every run of it, train nothing (any machine)
#   bash benchmarks/gpu_study.sh --toy --out /tmp/s # the same script at toy size on the CPU (seconds)
#   NORM_ARM=merge-norm LRS=1.5e-3,3e-3,6e-3 bash benchmarks/gpu_study.sh
#   STUDY=depth DEPTHS=12,24,36 STEPS=600 bash benchmarks/gpu_study.sh
#
# The model: U-ViT at the release's U-ViT-S/2 width, embed_dim 512, 8 heads, patch 2 (257 tokens),
# bf16 autocast, batch 32, on 32x32 digits (x0 prediction, mlp_conv, xavier skip_linear: the demo's
# and the stability preset's network). Settings, all optional, from the environment: STUDY, METHODS,
# NORM_ARM (the basin's normalisation arm: skip-norm or merge-norm), DEPTHS, LRS, SEEDS, STEPS, BATCH,
# JOBS, EVAL_EVERY, CKPT_EVERY, FIG1_LR, BUDGET_S (the sweep's wall-clock limit), NAME, OUT (the
# folder the sweep folder goes in), PY (the Python with scalelong), EXTRA (more overrides,
# space-separated), GPU_STUDY_TOY=1 (the same as --toy).
#
# The plan, from an estimated step time (no GPU measurement was available when it was written; run
# `--dry-run` first, then the study, and rescale STEPS by the `it/s` the first run prints):
#   * batch 32 x 257 tokens is far too small to fill an H100/H200, so an eager step is bound by
#     kernel launches: ~65 kernels per block (forward + backward, bf16 casts, mlp_conv) at ~20 us of
#     Python each is ~1.3 ms per transformer block per step, optimizer and EMA included. The
#     arithmetic alone is ~0.6 ms per block (20.5 MFLOP per token per block for forward + backward x
#     8,224 tokens = 169 GFLOP, at a realistic 300 TFLOP/s of bf16), so 1.3 ms is the one to plan by:
#     depth 12 (13 blocks) ~17 ms, depth 24 (25 blocks) ~33 ms, depth 36 (37 blocks) ~48 ms a step;
#     diagnostics every 25 steps add ~5%.
#   * fixed costs: ~30 s to start (imports, CUDA, first steps); per run ~3 s to build, ~2 s per FD
#     evaluation (eval.every 500), the final checkpoint (model + EMA + AdamW = 16 bytes a parameter,
#     ~5 s/GB with checksum and fsync: 44.5M parameters at depth 12 ~3.5 s, 85.7M at 24 ~7 s, 126.9M
#     at 36 ~10 s) and the sample grid: ~12 s at depth 12, ~16 s at 24, ~20 s at 36.
#   * the basin (STUDY=basin): depth 12 x 3 methods x 3 lrs = 9 runs. Each also measures the held-out
#     x0 error of the EMA and the trained weights at step 0 and at the end (256 digits x 11 levels in
#     fp32, ~6 TFLOP a level: ~1.1 s per weights and measurement, ~4.5 s a run; the mid-run
#     measurements of the preset are off, diagnostics.noise_levels_every=0) and skips FD: 30 + 9 x
#     (12 + 4.5) = 179 s fixed, 9 x 17 ms x 1.05 = 0.16 s per step of all nine runs. Planned to 75% of
#     the rest of BUDGET_S = 570 s: 0.75 x (570 - 179) / 0.16 = 1,830 -> STEPS=1800, 200 of them the
#     preset's warm-up, 1,600 at the constant lr (the CPU study's 1,000). A run that diverges to
#     non-finite values stops early and leaves time over. The skip-norm and merge-norm LayerNorms (6
#     per step, one per skip) are left out of the estimate: a few kernels next to ~850.
#   * the basin's lrs, from the CPU study by the usual width rule (Adam's lr scales as 1 / width for
#     the hidden layers, so 64 -> 512 divides it by 8; patch 2 only adds tokens): at width 64 the demo
#     U-ViT at depth 12 trains at 1e-2 to 2e-2 and `none` breaks from 2e-2 to 3e-2 (the depth study's
#     probe, the stability maps), so its edge at width 512 is expected near 1.25e-3 to 3.75e-3.
#     LRS=1e-3,2e-3,4e-3 brackets it at x2 spacing: 1e-3 inside the basin (twice the depth study's
#     scaled demo lr), 4e-3 past where `none` broke at width 64. If every method survives 4e-3 or
#     breaks at 1e-3, shift the grid by x2 and run again (finished runs are reused).
#   * the depth study (STUDY=depth): depths 12,24 x 4 methods: 30 + 4 x (12 + 16) = 142 s fixed, 4 x
#     (17 + 33) ms x 1.05 = 0.21 s per step of all eight runs. Of BUDGET_S = 570 s (30 s are left for
#     the report and the start of the machine), 428 s remain; planned to 75% of them against an
#     estimate that may be off: 0.75 x 428 / 0.21 = 1,529 -> STEPS=1500. With depth 36 too: 30 + 4 x
#     (12 + 16 + 20) = 222 s fixed, 4 x (17 + 33 + 48) ms x 1.05 = 0.41 s per step: 0.75 x (570 - 222)
#     / 0.41 = 636 -> DEPTHS=12,24,36 STEPS=600. One lr: the demo's 5e-3 at width 64, scaled by 64/512
#     (6e-4), rounded down to 5e-4 (the release trains U-ViT-S/2 on CIFAR-10 at 2e-4).
#   * one seed (seed noise is then unmeasured: SEEDS=3 needs STEPS/3). Checkpoints at the end only
#     (CKPT_EVERY=0): one mid-run checkpoint would cost as much as 200 steps. A run cut off by the time
#     limit therefore starts over when the script is run again.
#
# A failure midway keeps what finished: the runs train one after another into <OUT>/<NAME>-sweep/runs,
# a run that fails or diverges is recorded and the others go on, `timeout` stops the sweep at
# BUDGET_S, and whenever the sweep does not end cleanly the report is written again from every
# finished run. Running the same command again trains only what is missing.
set -uo pipefail # no -e: the report must be written after a sweep that failed or ran out of time

TOY=${GPU_STUDY_TOY:-0}
DRY_RUN=0
while [ $# -gt 0 ]; do
    case "$1" in
        --toy) TOY=1 ;;
        --dry-run) DRY_RUN=1 ;;
        --out) OUT=${2:?--out needs a folder}; shift ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "error: unknown argument $1 (use --toy, --dry-run, --out DIR)" >&2; exit 2 ;;
    esac
    shift
done
if [ -n "${OUT:-}" ]; then OUT=$(realpath -m "$OUT"); fi  # relative to where the script was started
cd "$(dirname "$0")/.."

if [ -x .venv/bin/python ]; then PY=${PY:-.venv/bin/python}; else PY=${PY:-python3}; fi
OUT=${OUT:-runs}
STUDY=${STUDY:-basin}
case "$STUDY" in
    basin)  # the lr basin on the stability preset: constant lr after warm-up, the untrained model's
            # error (the cap) and the trained weights' beside the EMA's
        PRESET=stability NAME=${NAME:-gpu-basin} METHODS=${METHODS:-none,cs,${NORM_ARM:-skip-norm}}
        STUDY_RUN="diagnostics.noise_levels_at_start=true diagnostics.noise_levels_raw=true diagnostics.noise_levels_every=0" ;;
    depth)
        PRESET=demo_uvit NAME=${NAME:-gpu-study} STUDY_RUN="" ;;
    *) echo "error: STUDY=$STUDY: choose basin or depth" >&2; exit 2 ;;
esac
if [ "$TOY" = 1 ]; then  # the same study, small enough for a CPU test: the script's own check
    if [ "$STUDY" = basin ]; then
        DEPTHS=${DEPTHS:-2} LRS=${LRS:-1e-2,1e3} EXTRA_TOY="optim.warmup_steps=1 diagnostics.noise_levels=8 train.max_nonfinite_steps=2"
    else
        METHODS=${METHODS:-none,cs} DEPTHS=${DEPTHS:-2,4} LRS=${LRS:-1e-2} EXTRA_TOY=""
    fi
    SEEDS=${SEEDS:-1} STEPS=${STEPS:-4} BATCH=${BATCH:-8} EVAL_EVERY=${EVAL_EVERY:-0} BUDGET_S=${BUDGET_S:-300}
    MODEL="model.uvit.embed_dim=16 model.uvit.num_heads=2 model.uvit.patch_size=8"
    RUN="train.device=cpu train.mixed_precision=no train.log_every=2 diagnostics.every=2 sample.num_images=0 $EXTRA_TOY"
else
    if [ "$STUDY" = basin ]; then
        DEPTHS=${DEPTHS:-12} LRS=${LRS:-1e-3,2e-3,4e-3} STEPS=${STEPS:-1800} EVAL_EVERY=${EVAL_EVERY:-0}
    else
        METHODS=${METHODS:-none,sqrt2,cs,ls} DEPTHS=${DEPTHS:-12,24} LRS=${LRS:-5e-4} STEPS=${STEPS:-1500}
        EVAL_EVERY=${EVAL_EVERY:-500}
    fi
    SEEDS=${SEEDS:-1} BATCH=${BATCH:-32} BUDGET_S=${BUDGET_S:-570}
    MODEL="model.uvit.embed_dim=512 model.uvit.num_heads=8 model.uvit.patch_size=2"
    RUN="train.device=cuda train.mixed_precision=bf16"
fi
JOBS=${JOBS:-1}
CKPT_EVERY=${CKPT_EVERY:-0}
# shellcheck disable=SC2206  # word splitting of the override lists is intended
OVERRIDES=($MODEL $RUN $STUDY_RUN "train.steps=$STEPS" "train.batch_size=$BATCH" "train.checkpoint_every=$CKPT_EVERY"
           "eval.every=$EVAL_EVERY" "out_dir=$OUT" "name=$NAME" ${EXTRA:-})
GRID=(--methods "$METHODS" --depths "$DEPTHS" --lrs "$LRS" --seeds "$SEEDS" --jobs "$JOBS" --no-progress)
if [ -n "${FIG1_LR:-}" ]; then GRID+=(--fig1-lr "$FIG1_LR"); fi
SWEEP="$OUT/$NAME-sweep"

if [ "$DRY_RUN" = 1 ]; then
    exec "$PY" -m scalelong.cli sweep "$PRESET" "${OVERRIDES[@]}" "${GRID[@]}" --dry-run
fi
if [ "$TOY" != 1 ] && ! "$PY" -c "import sys, torch
sys.exit(not torch.cuda.is_available() or print('gpu_study: on', torch.cuda.get_device_name()))"; then
    echo "error: no CUDA device; run with --toy (CPU) or --dry-run" >&2
    exit 2
fi

echo "gpu_study ($STUDY, $PRESET): $METHODS x depths $DEPTHS x lr $LRS x $SEEDS seed(s), $STEPS steps, limit ${BUDGET_S}s -> $SWEEP"
start=$SECONDS
timeout --signal=TERM --kill-after=60 "$BUDGET_S" \
    "$PY" -m scalelong.cli sweep "$PRESET" "${OVERRIDES[@]}" "${GRID[@]}"
status=$?
echo "gpu_study: sweep ended with status $status after $((SECONDS - start)) s"
if [ "$status" != 0 ]; then
    # 124: the time limit; 2: runs failed or a run was interrupted; other: a crash. Either way the
    # finished runs are in $SWEEP/runs: write the report of those.
    [ "$status" = 124 ] && echo "gpu_study: stopped at the ${BUDGET_S}s limit; reporting the finished runs"
    "$PY" - "$PRESET" "${OVERRIDES[@]}" <<'PYTHON' || echo "gpu_study: no report written" >&2
import os
import sys
from pathlib import Path

from scalelong.training.config import load_config
from scalelong.errors import ScaleLongError
from scalelong.studies.sweep import report_sweep

cfg = load_config(sys.argv[1], sys.argv[2:])
fig1_lr = float(os.environ["FIG1_LR"]) if os.environ.get("FIG1_LR") else None
try:
    report_sweep(cfg, Path(cfg.out_dir) / f"{cfg.name}-sweep", fig1_lr=fig1_lr)
except ScaleLongError as e:
    sys.exit(f"error: {e}")
PYTHON
fi
if [ -f "$SWEEP/report.md" ]; then
    echo "report: $SWEEP/report.md"
    echo "        $SWEEP/report.html"
fi
exit "$status"
