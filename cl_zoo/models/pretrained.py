"""The zoo's pretrained checkpoints: one :func:`register_pretrained` call per published model.

Entries whose folder is bundled under ``model_cards/`` load offline; the others resolve through
the Hugging Face Hub (or, for author-released files, their original URL) via :mod:`cl_zoo.hub`.
Every bundled file is pinned by sha256 here, so a stale or edited copy is refused rather than used.
"""

from __future__ import annotations

from cl_zoo.registry import IMAGENET_MEAN, IMAGENET_STD, PretrainedCfg, register_pretrained

# The bundled default of `cl-zoo embed` (cl_zoo.registry.DEFAULT_MODEL): trained on a 2-core CPU with
# `cl-zoo pretrain --recipe recipes/dcl_imagenette64_cpu.yaml`, evaluated with `cl-zoo knn` /
# `cl-zoo linear-eval` on Imagenette val (see model_cards/dcl_resnet18.imagenette64_cpu/README.md).
register_pretrained(
    "dcl_resnet18.imagenette64_cpu",
    "resnet18",
    PretrainedCfg(
        bundled="dcl_resnet18.imagenette64_cpu",
        sha256={"model.safetensors": "c73fd280a4ff1f6db1cbf3fb04a8370b274760988668e6d9fd5ae86155dcb18f"},
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        input_size=(3, 64, 64),
        interpolation="bilinear",
        crop_pct=0.875,
        method="dcl",
        paper="Decoupled Contrastive Learning (Yeh et al., ECCV 2022)",
        dataset="imagenette",
        epochs=25,
        license="apache-2.0",
        metrics={
            "imagenette_knn_k20_top1": 0.5376,
            "imagenette_knn_k200_top1": 0.5304,
            "imagenette_linear_fast_top1": 0.5582,
        },
        notes="Half-width ResNet-18 trained for 25 epochs at 64 px on a 2-core CPU: a small default, not a research checkpoint.",
    ),
    width=0.5,
)
