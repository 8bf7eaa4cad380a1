#!/usr/bin/env bash
# GPU check of the benchmark harness: U-ViT-S/2 at CIFAR-10 shapes, batch 128, bf16 autocast.
# Writes results/*_cuda*.json|md next to the CPU results; about 5-8 minutes on one recent GPU
# (the torch.compile case dominates). Usage: bash benchmarks/gpu_check.sh [python]
set -euo pipefail
PY=${1:-.venv/bin/python}
cd "$(dirname "$0")/.."
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
# img/s and peak allocated memory of the real trainer step (EMA, grad norm, AdamW included)
$PY -m benchmarks.throughput --device cuda --batch 128 --precision bf16 --repeats 20 \
    --configs "U-ViT-S/2 CIFAR-10" "DDPM UNet CIFAR-10"
# step-time ratio of every skip method to none (goals: cs, sqrt2 <= 1.01; ls, ls-nonshare <= 1.03)
$PY -m benchmarks.method_overhead --device cuda --batch 128 --bf16 --repeats 20
# fast paths on the GPU: channels_last, bf16 vs fp32, torch.compile (compile time apart)
$PY -m benchmarks.fast_paths --device cuda --batch 128 --repeats 10
$PY -m benchmarks.uvit_vs_reference --device cuda --batch 128 --repeats 20
# fp16 on the CPU (CUDA's policy, scalelong.fp16) against CUDA's own fp16 autocast: 100 steps of the
# stability preset from the same weights and draws; goal: losses within 1%, the same skipped steps
$PY -m benchmarks.fp16_faithful --against cuda --steps 100
# bf16 on the CPU without bf16 units (CUDA's policy) against CUDA's own bf16 autocast, the same way
$PY -m benchmarks.fp16_faithful --dtype bf16 --against cuda --steps 100
