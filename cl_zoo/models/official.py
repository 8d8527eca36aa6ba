"""The papers' own ImageNet checkpoints, as released by their authors.

Each entry's source is the authors' original file (``PretrainedCfg.url``); on first use
:func:`cl_zoo.convert.official.load_official` downloads it, reads it with ``weights_only=True``,
converts it to the zoo format and caches the converted folder under
``$CL_ZOO_CACHE/official/<name>`` (default ``~/.cache/cl-zoo/official``).

Checksums: none of these authors publish a sha256. MoCo publishes the first 8 hex digits of
each file's md5, which are pinned here (``md5_prefix``) and verified; for JCL, CMC and CACR no
checksum of any kind is published, so the converted folder records the sha256 of the file that
was actually downloaded (in its config and model card) instead of an invented pin.

Reported numbers are the papers' (or, where stated, the release pages') ImageNet-1k linear
probe top-1/top-5, stored as fractions like every metric in the zoo.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cl_zoo.registry import PretrainedCfg, register_pretrained

CC_BY_NC = "cc-by-nc-4.0"


@dataclass(frozen=True)
class OfficialRelease:
    """What the converter needs beyond :class:`PretrainedCfg`: the layout and the release page."""

    name: str  # registry name
    format: str  # "jcl" | "cmc" | "cacr" | "moco": the converter that reads the file
    arch: str
    url: str  # direct download
    page: str  # where the authors link the file (shown in the model card)
    filename: str  # the file's name in the release
    md5_prefix: str | None = None  # as published (MoCo's README lists 8 hex digits)
    sha256: str | None = None  # only when the authors publish one (none do, at the time of writing)
    reported: dict[str, float] = field(default_factory=dict)  # fractions
    reported_source: str = ""
    citation: str | None = None  # overrides the card's citation (MoCo v1)


OFFICIAL_RELEASES: dict[str, OfficialRelease] = {}


def _register(release: OfficialRelease, *, method: str, paper: str, epochs: int, license: str, notes: str,
              mean: tuple[float, float, float] | None = None, std: tuple[float, float, float] | None = None) -> None:
    from cl_zoo.registry import get_arch

    base = get_arch(release.arch).default_cfg
    cfg = PretrainedCfg(
        url=release.url,
        filename=release.filename,
        sha256={release.filename: release.sha256} if release.sha256 else {},
        mean=mean or base.mean,
        std=std or base.std,
        input_size=base.input_size,
        interpolation=base.interpolation,
        crop_pct=base.crop_pct,
        method=method,
        paper=paper,
        dataset="imagenet-1k",
        epochs=epochs,
        license=license,
        metrics=dict(release.reported),
        notes=notes,
    )
    OFFICIAL_RELEASES[release.name] = release
    register_pretrained(release.name, release.arch, cfg)


# --- JCL (Cai et al., NeurIPS 2020) ----------------------------------------------------------------
_register(
    OfficialRelease(
        name="jcl_resnet50.in1k_official",
        format="jcl",
        arch="resnet50",
        url="https://github.com/caiqi/Joint-Contrastive-Learning/releases/download/v0.1/checkpoint_0199.pth.tar",
        page="https://github.com/caiqi/Joint-Contrastive-Learning#models",
        filename="checkpoint_0199.pth.tar",
        reported={"imagenet1k_linear_top1_reported": 0.687, "imagenet1k_linear_top5_reported": 0.890},
        reported_source="JCL paper, Table 1 (ResNet-50, 200 epochs)",
    ),
    method="jcl",
    paper="https://arxiv.org/abs/2009.14776",
    epochs=200,
    license=CC_BY_NC,
    notes=(
        "Authors' release (GitHub release v0.1). Trained with the repository's scripts/main_pretrain.sh "
        "(MoCo v2 base with MLP head, tau 0.2, lambda 2.0 ramped, 5 key crops, batch 256, lr 0.03, 200 epochs); "
        "the paper's Table 1 recipe lists lambda 4.0, batch 512, lr 0.06. No checksum is published."
    ),
)

# --- CMC (Tian et al., ECCV 2020): HobbitLong/CMC's Dropbox folder ---------------------------------
_CMC_FOLDER = "https://www.dropbox.com/sh/5k4t77mt4011gyr/AABkBvKm2bGNNut0m6bLMK84a"
for _arch, _file, _top1, _top5, _extra in (
    ("cmc_resnet50x05_lab", "CMC_resnet50v1.pth", 0.575, 0.803, ""),
    ("cmc_resnet50x1_lab", "CMC_resnet50v2.pth", 0.640, 0.855,
     " The README says this file was trained with FastAutoAugment (about +0.8-1% over the paper's recipe)."),
    ("cmc_resnet50x2_lab", "CMC_resnet50v3.pth", 0.683, 0.882,
     " The README says this file was trained with FastAutoAugment (about +0.8-1% over the paper's recipe)."),
):
    _register(
        OfficialRelease(
            name=f"{_arch}.in1k_official",
            format="cmc",
            arch=_arch,
            # A file inside a Dropbox shared folder is addressed as <folder link>/<file name>; dl=1
            # asks for the bytes instead of the preview page.
            url=f"{_CMC_FOLDER}/{_file}?dl=1",
            page=f"{_CMC_FOLDER}?dl=0",
            filename=_file,
            reported={"imagenet1k_linear_top1_reported": _top1, "imagenet1k_linear_top5_reported": _top5},
            reported_source="CMC paper, Table 1 ({L, ab}, ResNet-50 per view, single crop)",
        ),
        method="cmc",
        paper="https://arxiv.org/abs/1906.05849",
        epochs=200,
        license="bsd-2-clause",
        notes=(
            "Authors' release (Dropbox folder linked from HobbitLong/CMC). Trained with NCE loss, Lab, 4096 "
            "negatives and apex amp (O2: convolution weights may be stored in float16; converted losslessly "
            "to float32)." + _extra + " No checksum is published. Features are the two views' pooled "
            "features concatenated (L first), as CMC's LinearProbing.py feeds its classifier."
        ),
    )

# --- CACR (Zheng et al., TMLR 2023) ----------------------------------------------------------------
_register(
    OfficialRelease(
        name="cacr_resnet50.in1k_official",
        format="cacr",
        arch="resnet50",
        # Google Drive file 17mE7obaWAG0-YMu3ffZLK-DkhNmn2hhB; the usercontent endpoint with confirm=t
        # serves large files without the "cannot scan for viruses" interstitial page.
        url="https://drive.usercontent.google.com/download?id=17mE7obaWAG0-YMu3ffZLK-DkhNmn2hhB&export=download&confirm=t",
        page="https://drive.google.com/file/d/17mE7obaWAG0-YMu3ffZLK-DkhNmn2hhB/view",
        filename="cacr_resnet50_1000ep.pth.tar",
        reported={"imagenet1k_linear_top1_reported": 0.747, "imagenet1k_knn_top1_reported": 0.694},
        reported_source="CACR paper Table 4 (linear, K=4) and JegZheng/CACR-SSL README (k-NN), 1000 epochs",
    ),
    method="cacr",
    paper="https://arxiv.org/abs/2105.03746",
    epochs=1000,
    license=CC_BY_NC,
    notes=(
        "Authors' release (Google Drive, linked from JegZheng/CACR-SSL). MoCo v3-style training "
        "(batch 4096, LARS, lr 0.3, wd 1.5e-6, momentum 0.996 cosine, zero-init residual, 1000 epochs). "
        "No checksum is published."
    ),
)

# --- MoCo v1 / v2 baselines (facebookresearch/moco) ------------------------------------------------
_MOCO = "https://dl.fbaipublicfiles.com/moco/moco_checkpoints"
_MOCO_PAGE = "https://github.com/facebookresearch/moco#models"
_register(
    OfficialRelease(
        name="mocov1_resnet50.in1k_official",
        format="moco",
        arch="resnet50",
        url=f"{_MOCO}/moco_v1_200ep/moco_v1_200ep_pretrain.pth.tar",
        page=_MOCO_PAGE,
        filename="moco_v1_200ep_pretrain.pth.tar",
        md5_prefix="b251726a",
        reported={"imagenet1k_linear_top1_reported": 0.606},
        reported_source="facebookresearch/moco README, Models table (200 epochs)",
        citation=(
            "@inproceedings{he2020moco,\n  title={Momentum Contrast for Unsupervised Visual Representation Learning},\n"
            "  author={He, Kaiming and Fan, Haoqi and Wu, Yuxin and Xie, Saining and Girshick, Ross},\n"
            "  booktitle={CVPR},\n  year={2020}\n}"
        ),
    ),
    method="moco",
    paper="https://arxiv.org/abs/1911.05722",
    epochs=200,
    license=CC_BY_NC,
    notes="Authors' release. The README publishes the md5 prefix b251726a (verified on download); no sha256.",
)
for _epochs, _md5, _top1 in ((200, "59fd9945", 0.677), (800, "a04e12f8", 0.711)):
    _register(
        OfficialRelease(
            name="mocov2_resnet50.in1k_official" if _epochs == 200 else "mocov2_resnet50.in1k_800ep_official",
            format="moco",
            arch="resnet50",
            url=f"{_MOCO}/moco_v2_{_epochs}ep/moco_v2_{_epochs}ep_pretrain.pth.tar",
            page=_MOCO_PAGE,
            filename=f"moco_v2_{_epochs}ep_pretrain.pth.tar",
            md5_prefix=_md5,
            reported={"imagenet1k_linear_top1_reported": _top1},
            reported_source=f"facebookresearch/moco README, Models table ({_epochs} epochs)",
        ),
        method="mocov2",
        paper="https://arxiv.org/abs/2003.04297",
        epochs=_epochs,
        license=CC_BY_NC,
        notes=f"Authors' release. The README publishes the md5 prefix {_md5} (verified on download); no sha256.",
    )
