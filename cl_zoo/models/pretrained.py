"""The zoo's pretrained checkpoints: one registration per published model.

Every zoo checkpoint is a folder under the repository's ``model_cards/`` and a Hub repo
``<namespace>/<name>`` with the same files (:func:`cl_zoo.checkpoint.hub.zoo_repo_id`). A checkout
loads them all offline from ``model_cards/``; a wheel ships only the default
(:data:`cl_zoo.registry.DEFAULT_MODEL`, pyproject.toml's package data) and downloads the others
from the Hub on first use. Every weights file is pinned by sha256 here, whichever copy is read, so a
stale or edited copy is refused rather than used; no revision is named, because a pin must not name
a Hub commit before it exists: the digests are the pin.
"""

from __future__ import annotations

from cl_zoo.constants import IMAGENET_MEAN, IMAGENET_STD, PAPERS
from cl_zoo.registry import ZOO_NAMESPACE, PretrainedCfg, register_pretrained


def _cpu_tier(
    method: str,
    arch: str,
    sha256: dict[str, str],
    metrics: dict[str, float],
    mean: tuple[float, float, float] = IMAGENET_MEAN,
    std: tuple[float, float, float] = IMAGENET_STD,
) -> None:
    """One checkpoint of the CPU tier (README "The CPU tier"): the eight methods trained by
    ``scripts/train_cpu_tier.sh METHOD`` with one protocol (Imagenette train, 64 px, batch 256, SGD
    with cosine decay, 30 epochs) on a 2-core CPU, published by ``scripts/bundle_cpu_tier.py``, which
    prints this call. ``metrics`` are the float16 weights' own, on Imagenette val with fp32 features.
    ``mean``/``std`` are the training input's (the folder's config.json; a test compares them).
    """
    name = f"{method}_resnet18.imagenette64_cpu"
    register_pretrained(
        name,
        arch,
        PretrainedCfg(
            hf_hub_id=f"{ZOO_NAMESPACE}/{name}",
            bundled=name,
            sha256=sha256,
            mean=mean,
            std=std,
            input_size=(3, 64, 64),
            interpolation="bilinear",
            crop_pct=0.875,
            method=method,
            paper=PAPERS[method][0],
            dataset="imagenette",
            epochs=30,
            license="apache-2.0",
            metrics=metrics,
            notes="CPU tier: trained for 30 epochs at 64 px on a 2-core CPU with the protocol shared by all eight "
            "methods (recipes/" + method + "_imagenette64_cpu_tier.yaml); a comparison at a small budget, not a research checkpoint.",
        ),
    )


# The bundled default of `cl-zoo embed` (cl_zoo.registry.DEFAULT_MODEL) is the tier's best by kNN k=200.
_cpu_tier("cacr", "resnet18", {
    "model.safetensors": "c08ef85218cb2c703216abcfd59a6e93552b4ace945a024a5d0c6d8adf6eab89",
}, {"imagenette_knn_k20_top1": 0.6288, "imagenette_knn_k200_top1": 0.6074, "imagenette_linear_fast_top1": 0.6492})
_cpu_tier("dcl", "resnet18", {
    "model.safetensors": "780fe820e3ac3bcaefa2bd34465eaa9675f08fa14ca681cd85e349288bb5952f",
}, {"imagenette_knn_k20_top1": 0.5712, "imagenette_knn_k200_top1": 0.5669, "imagenette_linear_fast_top1": 0.6145})
_cpu_tier("mocov2", "resnet18", {
    "model.safetensors": "7928dd5c6625c0e5473be916ab4f13b602964d8bd0566dbf9200fcbc13c90666",
}, {"imagenette_knn_k20_top1": 0.4785, "imagenette_knn_k200_top1": 0.4759, "imagenette_linear_fast_top1": 0.532})
_cpu_tier("simclr", "resnet18", {
    "model.safetensors": "72f33dad9f61e90ba37fbad208a325d97ba25cf0ba00aa758b3f10590e9ed7e0",
}, {"imagenette_knn_k20_top1": 0.4716, "imagenette_knn_k200_top1": 0.4678, "imagenette_linear_fast_top1": 0.5381})
_cpu_tier("dclw", "resnet18", {
    "model.safetensors": "7de0dbd33bbd18cc8bc106565bf043fcc767fc19e6070b496e4bb8f768132353",
}, {"imagenette_knn_k20_top1": 0.5501, "imagenette_knn_k200_top1": 0.5511, "imagenette_linear_fast_top1": 0.5944})
_cpu_tier("jcl", "resnet18", {
    "model.safetensors": "fbcf1179c3084d7247a03aa1f014abdf2429ebc964e0cc6f63d86a0cdda9d56c",
}, {"imagenette_knn_k20_top1": 0.4645, "imagenette_knn_k200_top1": 0.4655, "imagenette_linear_fast_top1": 0.5215})
_cpu_tier("simo", "resnet18", {
    "model.safetensors": "c282737266383a471cd8a9bd616c5b04ddd6a53330fd12df60081679b2bd21ef",
}, {"imagenette_knn_k20_top1": 0.4953, "imagenette_knn_k200_top1": 0.4775, "imagenette_linear_fast_top1": 0.5455})
# CMC's L/ab pair (cmc_resnet18_lab): the zoo's embed/knn/linear-eval take it; torchvision, timm and
# detectron2 cannot (neither half takes RGB), so it cannot be the default, which must export.
_cpu_tier("cmc", "cmc_resnet18_lab", {
    "model-00001-of-00002.safetensors": "b478737c1365570c1fd4616cb67be9b1051e73c3d54f219a46d11d2475aeee54",
    "model-00002-of-00002.safetensors": "7c95c227fbaea7a6b0a22b236a6575f1ddfb8854d16f4f9fe1acc8d6cb3371c5",
}, {"imagenette_knn_k20_top1": 0.6242, "imagenette_knn_k200_top1": 0.6028, "imagenette_linear_fast_top1": 0.6713},
    mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))  # RGB in [0, 1]: the pair converts to Lab itself
