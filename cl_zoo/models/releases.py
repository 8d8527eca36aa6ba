"""Third-party ImageNet checkpoints the zoo can load: the papers' authors' releases and lightly's.

Each :class:`Release` lists its *sources* in the order they are tried (a Hugging Face Hub file
first where the publisher put one there, then the publisher's own URL). Every URL, repo id, file
name, revision and checksum below is copied verbatim from the page named beside it, and that
page's line is kept in ``quote`` (``tests/convert/test_import_official.py`` checks that each value
appears in its quote, so an edit that drifts from the page fails). Nothing here is derived: where
a direct-download address differs from the published link (Google Drive's viewer page, a Dropbox
shared folder), :func:`cl_zoo.convert.sources.direct_url` rewrites it at download time, in code
that says so.

On first use :func:`cl_zoo.convert.sources.load_release` fetches the file from the first source
that works, verifies whatever checksum the publisher gives, converts it with the reader for its
layout (:mod:`cl_zoo.convert.readers`) and caches the zoo folder under
``$CL_ZOO_CACHE/releases/<name>`` (default ``~/.cache/cl-zoo/releases``).

Reported numbers are the publisher's (paper table or release page), stored as fractions like every
metric in the zoo; they describe the released file and are not re-measured here.

Mirrors. Publishers' links rot (Dropbox folders, Drive files, personal pages), so a release whose
licence allows it can be copied, converted, to a zoo Hub repo with ``cl-zoo publish --release``.
Whether a licence allows that is data, not a guess: :data:`REDISTRIBUTION` maps the licence id
each release is registered with (its ``licence_quote`` / ``licence_page`` say where it was read)
to a decision and its reason; a licence not in the table is refused. Once a mirror exists, its
repo id and the sha256 of each weights file go in :data:`MIRRORS`, and
:func:`cl_zoo.convert.sources.load_release` tries it after the publisher's own sources.
"""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass, field
from typing import Mapping, Union

from cl_zoo.registry import PretrainedCfg, get_arch, register_pretrained


@dataclass(frozen=True)
class HubSource:
    """A file in a Hugging Face Hub model repo, fetched with ``huggingface_hub.hf_hub_download``."""

    repo_id: str
    filename: str
    revision: str  # a commit sha where the page gives one
    page: str  # the page the repo id / file / revision were copied from
    quote: str  # that page's text, verbatim
    sha256: str | None = None  # as published (the Hub's LFS pointer)
    sha256_page: str | None = None
    sha256_quote: str | None = None
    note: str = ""

    def describe(self) -> str:
        return f"hf-hub:{self.repo_id}/{self.filename}@{self.revision}"


@dataclass(frozen=True)
class UrlSource:
    """A file at a published URL (copied verbatim; see ``cl_zoo.convert.sources.direct_url``)."""

    url: str
    page: str
    quote: str
    member: str | None = None  # a file inside a published shared folder
    md5_prefix: str | None = None  # as published (MoCo's README lists 8 hex digits)
    sha256: str | None = None
    note: str = ""

    def describe(self) -> str:
        return f"{self.url} ({self.member})" if self.member else self.url


Source = Union[HubSource, UrlSource]

# The publishers' checkpoint layouts cl_zoo.convert.readers reads (``cl-zoo import FORMAT``); here,
# torch-free, so the command's --help lists them without importing the readers.
FORMATS = ("jcl", "cmc", "cacr", "moco", "lightly")


@dataclass(frozen=True)
class Release:
    """One published checkpoint: where it is, who trained it and how, and what they reported."""

    name: str  # registry name
    format: str  # the reader in cl_zoo.convert.readers: "jcl" | "cmc" | "cacr" | "moco" | "lightly"
    arch: str
    filename: str  # local cache name of the downloaded file
    sources: tuple[Source, ...]
    trained_by: str  # said plainly on the card
    recipe: str
    licence_page: str
    licence_quote: str
    reported: dict[str, float] = field(default_factory=dict)  # fractions
    reported_source: str = ""
    reported_quote: str = ""
    citation: str | None = None  # overrides the card's citation (MoCo v1)
    # The licence id the release is registered with (set by _register from its ``license``), read
    # from licence_page / licence_quote; the key of REDISTRIBUTION.
    licence: str = ""

    @property
    def by_authors(self) -> bool:
        return self.trained_by.startswith("the paper's authors")

    @property
    def redistribution(self) -> "Redistribution":
        """Whether cl-zoo may publish a copy of this release (a mirror), and why; unknown licences: no."""
        return REDISTRIBUTION.get(self.licence) or Redistribution(
            False, f"cl-zoo has no redistribution terms recorded for the licence id {self.licence or '(none)'!r}; "
                   "read the licence and add it to REDISTRIBUTION in cl_zoo/models/releases.py")


@dataclass(frozen=True)
class Redistribution:
    """May a copy of the weights be published, and the reason (said on the mirror's card or in the refusal)."""

    allowed: bool
    terms: str


# Keyed by the licence ids used in this file. "other" is what a release without a licence statement
# is registered with (JCL: no statement, no LICENSE file): copyright law then reserves every right,
# so nobody but the rights holder may redistribute. CC-BY-NC is allowed because a mirror is a free,
# non-commercial copy with attribution; the NC terms travel with it on its card, and anyone using
# the mirror is bound by them exactly as with the original.
REDISTRIBUTION: dict[str, Redistribution] = {
    "mit": Redistribution(True, "the MIT licence permits copying and redistribution provided the copyright and "
                                "permission notice are kept with the copies (quoted on this card)"),
    "bsd-2-clause": Redistribution(True, "the BSD 2-Clause licence permits redistribution provided the copyright "
                                         "notice, the two conditions and the disclaimer are retained"),
    "bsd-3-clause": Redistribution(True, "the BSD 3-Clause licence permits redistribution provided the copyright "
                                         "notice, the conditions and the disclaimer are retained and the authors' "
                                         "names are not used to endorse it"),
    "apache-2.0": Redistribution(True, "the Apache License 2.0 permits redistribution with the licence and any "
                                       "NOTICE kept and modifications stated"),
    "cc-by-4.0": Redistribution(True, "CC BY 4.0 permits sharing and adapting for any purpose with attribution, "
                                      "a link to the licence and an indication of changes"),
    "cc-by-nc-4.0": Redistribution(True, "CC BY-NC 4.0 permits sharing and adapting with attribution, a link to "
                                         "the licence and an indication of changes, for NON-COMMERCIAL purposes "
                                         "only: this mirror is a free non-commercial copy, and any use of it is "
                                         "bound by the same NonCommercial terms "
                                         "(https://creativecommons.org/licenses/by-nc/4.0/)"),
    "other": Redistribution(False, "no licence is stated, so all rights are reserved by the rights holder and "
                                   "copies may not be redistributed without their permission"),
}


@dataclass(frozen=True)
class Mirror:
    """A zoo Hub repo holding a converted copy of a release (``cl-zoo publish --release``).

    Pinned by the sha256 of each weights file, as ``publish --release`` prints them, never by a
    revision: the pins say which bytes are acceptable, wherever the repo's history goes.
    """

    repo_id: str
    sha256: Mapping[str, str]  # weights file name -> sha256

    def describe(self) -> str:
        return f"mirror hf-hub:{self.repo_id}"


RELEASES: dict[str, Release] = {}
# Release name -> its published mirror. Empty until a mirror is actually published: an entry naming
# a repo that does not exist would send every user to a dead source.
MIRRORS: dict[str, Mirror] = {}


def _register(release: Release, *, method: str, paper: str, epochs: int, license: str, notes: str,
              mean: tuple[float, float, float] | None = None, std: tuple[float, float, float] | None = None) -> None:
    base = get_arch(release.arch).default_cfg
    first_url = next((s for s in release.sources if isinstance(s, UrlSource)), None)
    cfg = PretrainedCfg(
        # ``url`` marks the entry as a release for cl_zoo.checkpoint.hub; the full ordered list is RELEASES[name].sources.
        url=first_url.url if first_url else release.sources[0].describe(),
        filename=release.filename,
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
        notes=f"Trained by {release.trained_by}. {notes}",
    )
    RELEASES[release.name] = dataclasses.replace(release, licence=license)
    register_pretrained(release.name, release.arch, cfg)


AUTHORS = "the paper's authors (their own release)"
CC_BY_NC = "cc-by-nc-4.0"

# --- JCL (Cai et al., NeurIPS 2020) ----------------------------------------------------------------
_JCL_PAGE = "https://github.com/caiqi/Joint-Contrastive-Learning/blob/93a3a1285dd6d8f2a39be4f499ab5a75bca4b10d/README.md"
_register(
    Release(
        name="jcl_resnet50.in1k_official",
        format="jcl",
        arch="resnet50",
        filename="jcl_checkpoint_0199.pth.tar",
        sources=(
            UrlSource(
                url="https://github.com/anonymouszyx/JCL/releases/download/v1/checkpoint_0199.pth.tar",
                page=_JCL_PAGE + "#models",
                quote="Our pre-trained ResNet-50 models can be downloaded from "
                      "[ResNet-50](https://github.com/anonymouszyx/JCL/releases/download/v1/checkpoint_0199.pth.tar).",
            ),
        ),
        trained_by=AUTHORS,
        recipe="the repository's scripts/main_pretrain.sh (MoCo v2 base with MLP head, tau 0.2, lambda 2.0 ramped, "
               "5 key crops, batch 256, lr 0.03, 200 epochs); the paper's Table 1 recipe lists lambda 4.0, batch 512, lr 0.06",
        licence_page=_JCL_PAGE,
        licence_quote="(no licence statement; the repository has no LICENSE file)",
        reported={"imagenet1k_linear_top1_reported": 0.687, "imagenet1k_linear_top5_reported": 0.890},
        reported_source="JCL paper (https://arxiv.org/abs/2009.14776), Table 1, ResNet-50, 200 epochs",
        reported_quote="| JCL   | ResNet-50     | 24         | 68.7                                   | 89.0              |",
    ),
    method="jcl",
    paper="https://arxiv.org/abs/2009.14776",
    epochs=200,
    license="other",
    notes=(
        "The authors' page states no licence and the repository has no LICENSE file; its code is a "
        "modification of facebookresearch/moco (CC-BY-NC 4.0), so treat the weights as non-commercial. "
        "No checksum is published."
    ),
)

# --- CMC (Tian et al., ECCV 2020): HobbitLong/CMC's Dropbox folder ---------------------------------
_CMC_PAGE = "https://github.com/HobbitLong/CMC/blob/7b227be0b10ef4e526c72af07664f5079ed9ee09/README.md"
_CMC_QUOTE = ("Pretrained weights can be found in "
              "[Dropbox](https://www.dropbox.com/sh/5k4t77mt4011gyr/AABkBvKm2bGNNut0m6bLMK84a?dl=0).")
_CMC_FAA = ("- `CMC_resnet50v2.pth` and `CMC_resnet50v3.pth` are trained with FastAutoAugment, which improves the "
            "downstream accuracy by 0.8~1%. I will update weights without FastAutoAugment once they are available.")
for _arch, _file, _top1, _top5, _row, _extra in (
    ("cmc_resnet50x05_lab", "CMC_resnet50v1.pth", 0.575, 0.803, "57.5 / 80.3", ""),
    ("cmc_resnet50x1_lab", "CMC_resnet50v2.pth", 0.640, 0.855, "64.0 / 85.5",
     " The README says this file was trained with FastAutoAugment (about +0.8-1% over the paper's recipe)."),
    ("cmc_resnet50x2_lab", "CMC_resnet50v3.pth", 0.683, 0.882, "68.3 / 88.2",
     " The README says this file was trained with FastAutoAugment (about +0.8-1% over the paper's recipe)."),
):
    _register(
        Release(
            name=f"{_arch}.in1k_official",
            format="cmc",
            arch=_arch,
            filename=_file,
            sources=(
                UrlSource(
                    url="https://www.dropbox.com/sh/5k4t77mt4011gyr/AABkBvKm2bGNNut0m6bLMK84a?dl=0",
                    page=_CMC_PAGE + "#pretrained-models",
                    quote=_CMC_QUOTE + ("\n" + _CMC_FAA if _file != "CMC_resnet50v1.pth" else ""),
                    member=_file,
                    note="" if _file != "CMC_resnet50v1.pth" else (
                        "CMC_resnet50v1.pth is not named on the page (it names v2 and v3); the name follows "
                        "the README's --model resnet50v1 and the v2/v3 pattern"),
                ),
            ),
            trained_by=AUTHORS,
            recipe="NCE loss, Lab colour space, 4096 negatives, apex amp (the README's Pretrained Models notes)",
            licence_page="https://github.com/HobbitLong/CMC/blob/7b227be0b10ef4e526c72af07664f5079ed9ee09/LICENSE",
            licence_quote="BSD 2-Clause License",
            reported={"imagenet1k_linear_top1_reported": _top1, "imagenet1k_linear_top5_reported": _top5},
            reported_source="CMC paper (https://arxiv.org/abs/1906.05849), Table 1, {L, ab}, ResNet-50 per view, single crop",
            reported_quote=_row,
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

# --- CACR (Zheng et al., TMLR 2023): the Hub first, Google Drive second -----------------------------
_CACR_GITHUB = "https://github.com/JegZheng/CACR-SSL/blob/fbc9d94810cf55c8461ed86a60e48e70e14acbbe/imagenet_pretraining/README.md"
_register(
    Release(
        name="cacr_resnet50.in1k_official",
        format="cacr",
        arch="resnet50",
        filename="checkpoint_resnet_cacr.pth.tar",
        sources=(
            HubSource(
                repo_id="hjzheng/CACR",
                filename="checkpoint_resnet_cacr.pth.tar",
                revision="5b33a2045e24a9c185d112f028ba2915f33410cf",
                page="https://huggingface.co/hjzheng/CACR/tree/5b33a2045e24a9c185d112f028ba2915f33410cf",
                quote="checkpoint_resnet_cacr.pth.tar\n413 MB\nLFS\nUpload CACR checkpoints",
                sha256="e05b7afbc29d79e461f99b2d8da99eff641e92800c1edcf1567f81535308e3dd",
                sha256_page="https://huggingface.co/hjzheng/CACR/commit/5b33a2045e24a9c185d112f028ba2915f33410cf",
                sha256_quote="checkpoint_resnet_cacr.pth.tar ADDED\n"
                             "+ oid sha256:e05b7afbc29d79e461f99b2d8da99eff641e92800c1edcf1567f81535308e3dd\n"
                             "+ size 413100101",
                note="revision 5b33a20 is the commit 'Upload CACR checkpoints'; main (204da3b) changed only README.md",
            ),
            UrlSource(
                url="https://drive.google.com/file/d/17mE7obaWAG0-YMu3ffZLK-DkhNmn2hhB/view?usp=sharing",
                page=_CACR_GITHUB,
                quote='<td align="center"><a href="https://drive.google.com/file/d/17mE7obaWAG0-YMu3ffZLK-DkhNmn2hhB/'
                      'view?usp=sharing">download</a></td>',
                note="no checksum is published for the Drive copy; the sha256 of what was downloaded is recorded",
            ),
        ),
        trained_by=AUTHORS,
        recipe="MoCo v3-style training (batch 4096, LARS, lr 0.3, wd 1.5e-6, momentum 0.996 cosine, "
               "zero-init residual, 1000 epochs), imagenet_pretraining/README.md",
        licence_page="https://huggingface.co/hjzheng/CACR/blob/main/README.md",
        licence_quote="license: mit",
        reported={"imagenet1k_linear_top1_reported": 0.747, "imagenet1k_knn_top1_reported": 0.694},
        reported_source="JegZheng/CACR-SSL imagenet_pretraining/README.md, Main results (ResNet50, 1000 epochs)",
        reported_quote='<td align="left">ResNet50</td>\n<td align="right">1000</td>\n'
                       '<td align="center">74.7</td>\n<td align="center">69.4</td>',
    ),
    method="cacr",
    paper="https://arxiv.org/abs/2105.03746",
    epochs=1000,
    license="mit",
    notes=(
        "Authors' release, on the Hugging Face Hub (hjzheng/CACR, whose model card states license: mit) and on "
        "Google Drive (linked from JegZheng/CACR-SSL, whose imagenet_pretraining code is CC BY-NC 4.0). "
        "The Hub's LFS sha256 is pinned and verified for the Hub file."
    ),
)

# --- MoCo v1 / v2 baselines (facebookresearch/moco) ------------------------------------------------
_MOCO_PAGE = "https://github.com/facebookresearch/moco/blob/56700212990d83b3292bbaa6207c96f1ae4c90f8/README.md"
_MOCO_LICENCE = "This project is under the CC-BY-NC 4.0 license. See [LICENSE](LICENSE) for details."
_register(
    Release(
        name="mocov1_resnet50.in1k_official",
        format="moco",
        arch="resnet50",
        filename="moco_v1_200ep_pretrain.pth.tar",
        sources=(
            UrlSource(
                url="https://dl.fbaipublicfiles.com/moco/moco_checkpoints/moco_v1_200ep/moco_v1_200ep_pretrain.pth.tar",
                page=_MOCO_PAGE + "#models",
                quote='<td align="center">60.6</td>\n<td align="center"><a href="https://dl.fbaipublicfiles.com/moco/'
                      'moco_checkpoints/moco_v1_200ep/moco_v1_200ep_pretrain.pth.tar">download</a></td>\n'
                      '<td align="center"><tt>b251726a</tt></td>',
                md5_prefix="b251726a",
            ),
        ),
        trained_by=AUTHORS,
        recipe="MoCo v1 defaults of main_moco.py (200 epochs, batch 256, lr 0.03)",
        licence_page=_MOCO_PAGE + "#license",
        licence_quote=_MOCO_LICENCE,
        reported={"imagenet1k_linear_top1_reported": 0.606},
        reported_source="facebookresearch/moco README, Models table (200 epochs)",
        reported_quote='<td align="center">60.6</td>',
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
for _epochs, _md5, _top1, _acc in ((200, "59fd9945", 0.677, "67.7"), (800, "a04e12f8", 0.711, "71.1")):
    _url = f"https://dl.fbaipublicfiles.com/moco/moco_checkpoints/moco_v2_{_epochs}ep/moco_v2_{_epochs}ep_pretrain.pth.tar"
    _register(
        Release(
            name="mocov2_resnet50.in1k_official" if _epochs == 200 else "mocov2_resnet50.in1k_800ep_official",
            format="moco",
            arch="resnet50",
            filename=f"moco_v2_{_epochs}ep_pretrain.pth.tar",
            sources=(
                UrlSource(
                    url=_url,
                    page=_MOCO_PAGE + "#models",
                    quote=f'<td align="center">{_acc}</td>\n<td align="center"><a href="{_url}">download</a></td>\n'
                          f'<td align="center"><tt>{_md5}</tt></td>',
                    md5_prefix=_md5,
                    note="the page lists three rows of this shape; the quote is this file's row",
                ),
            ),
            trained_by=AUTHORS,
            recipe=f"MoCo v2 (--mlp --moco-t 0.2 --aug-plus --cos), {_epochs} epochs, batch 256, lr 0.03",
            licence_page=_MOCO_PAGE + "#license",
            licence_quote=_MOCO_LICENCE,
            reported={"imagenet1k_linear_top1_reported": _top1},
            reported_source=f"facebookresearch/moco README, Models table ({_epochs} epochs)",
            reported_quote=f'<td align="center">{_acc}</td>',
        ),
        method="mocov2",
        paper="https://arxiv.org/abs/2003.04297",
        epochs=_epochs,
        license=CC_BY_NC,
        notes=f"Authors' release. The README publishes the md5 prefix {_md5} (verified on download); no sha256.",
    )

# --- lightly's ImageNet-1k ResNet-50 benchmark checkpoints (third-party runs) ----------------------
_LIGHTLY_PAGE = ("https://github.com/lightly-ai/lightly/blob/e8d317fc5a87f4387a85a35e689869039ec249ee/"
                 "docs/source/getting_started/benchmarks.rst")
_LIGHTLY_CODE = "https://github.com/lightly-ai/lightly/tree/e8d317fc5a87f4387a85a35e689869039ec249ee/benchmarks/imagenet/resnet50"
_LIGHTLY_ROWS = {
    "mocov2_resnet50.in1k_100ep_lightly": '"MoCoV2", "Res50", "256", "100", "61.5", "84.1", "74.3", "91.9", "41.8", "72.2", "`tensorboard MoCoV2 <https://lightly-ssl-checkpoints.s3.amazonaws.com/imagenet_resnet50_mocov2_2024-02-18_10-29-14/pretrain/version_0/events.out.tfevents.1708248562.Machine2.439033.0>`_", "`checkpoint MoCoV2 <https://lightly-ssl-checkpoints.s3.amazonaws.com/imagenet_resnet50_mocov2_2024-02-18_10-29-14/pretrain/version_0/checkpoints/epoch%3D99-step%3D500400.ckpt>`_"',  # noqa: E501
    "simclr_resnet50.in1k_lightly": '"SimCLR*", "Res50", "256", "100", "63.2", "85.2", "73.9", "91.9", "44.8", "73.9", "`tensorboard SimCLR <https://lightly-ssl-checkpoints.s3.amazonaws.com/imagenet_resnet50_simclr_2023-06-22_09-11-13/pretrain/version_0/events.out.tfevents.1687417883.Machine2.33270.0>`_", "`checkpoint SimCLR <https://lightly-ssl-checkpoints.s3.amazonaws.com/imagenet_resnet50_simclr_2023-06-22_09-11-13/pretrain/version_0/checkpoints/epoch%3D99-step%3D500400.ckpt>`_"',  # noqa: E501
    "dcl_resnet50.in1k_lightly": '"SimCLR* + DCL", "Res50", "256", "100", "65.1", "86.2", "73.5", "91.7", "49.6", "77.5", "`tensorboard SimCLR + DCL <https://lightly-ssl-checkpoints.s3.amazonaws.com/imagenet_resnet50_dcl_2023-07-04_16-51-40/pretrain/version_0/events.out.tfevents.1688482310.Machine2.247807.0>`_", "`checkpoint SimCLR + DCL <https://lightly-ssl-checkpoints.s3.amazonaws.com/imagenet_resnet50_dcl_2023-07-04_16-51-40/pretrain/version_0/checkpoints/epoch%3D99-step%3D500400.ckpt>`_"',  # noqa: E501
    "dclw_resnet50.in1k_lightly": '"SimCLR* + DCLW", "Res50", "256", "100", "64.5", "86.0", "73.2", "91.5", "48.5", "76.8", "`tensorboard SimCLR + DCLW <https://lightly-ssl-checkpoints.s3.amazonaws.com/imagenet_resnet50_dclw_2023-07-07_14-57-13/pretrain/version_0/events.out.tfevents.1688734645.Machine2.3176.0>`_", "`checkpoint SimCLR + DCLW <https://lightly-ssl-checkpoints.s3.amazonaws.com/imagenet_resnet50_dclw_2023-07-07_14-57-13/pretrain/version_0/checkpoints/epoch%3D99-step%3D500400.ckpt>`_"',  # noqa: E501
}
_LIGHTLY_URLS = {
    "mocov2_resnet50.in1k_100ep_lightly": "https://lightly-ssl-checkpoints.s3.amazonaws.com/imagenet_resnet50_mocov2_2024-02-18_10-29-14/pretrain/version_0/checkpoints/epoch%3D99-step%3D500400.ckpt",  # noqa: E501
    "simclr_resnet50.in1k_lightly": "https://lightly-ssl-checkpoints.s3.amazonaws.com/imagenet_resnet50_simclr_2023-06-22_09-11-13/pretrain/version_0/checkpoints/epoch%3D99-step%3D500400.ckpt",  # noqa: E501
    "dcl_resnet50.in1k_lightly": "https://lightly-ssl-checkpoints.s3.amazonaws.com/imagenet_resnet50_dcl_2023-07-04_16-51-40/pretrain/version_0/checkpoints/epoch%3D99-step%3D500400.ckpt",  # noqa: E501
    "dclw_resnet50.in1k_lightly": "https://lightly-ssl-checkpoints.s3.amazonaws.com/imagenet_resnet50_dclw_2023-07-07_14-57-13/pretrain/version_0/checkpoints/epoch%3D99-step%3D500400.ckpt",  # noqa: E501
}
_LIGHTLY_METRICS = ("linear_top1", "linear_top5", "finetune_top1", "finetune_top5", "knn_top1", "knn_top5")


def lightly_reported(row: str) -> dict[str, float]:
    """The row's six accuracy columns, read from the quoted row itself so the two cannot disagree."""
    cells = next(csv.reader([row], skipinitialspace=True))
    return {f"imagenet1k_{m}_reported": float(v) / 100 for m, v in zip(_LIGHTLY_METRICS, cells[4:10])}


_SIMCLR_RECIPE = ("lightly's benchmarks/imagenet/resnet50/{script} with main.py: torchvision resnet50 (fc = Identity), "
                  "SimCLR projection head, {loss}, LARS with square-root lr scaling (0.075 x sqrt(batch)), "
                  "weight decay 1e-6, 10 warm-up epochs then cosine, SimCLRTransform augmentations, "
                  "total batch 256 on 2 GPUs, 100 epochs, 16-bit mixed precision")
for _name, _method, _paper, _script, _loss in (
    ("dcl_resnet50.in1k_lightly", "dcl", "https://arxiv.org/abs/2110.06848", "dcl.py", "DCLLoss(temperature=0.1)"),
    ("dclw_resnet50.in1k_lightly", "dclw", "https://arxiv.org/abs/2110.06848", "dclw.py",
     "DCLWLoss(temperature=0.1, sigma=0.5)"),
    ("simclr_resnet50.in1k_lightly", "simclr", "https://arxiv.org/abs/2002.05709", "simclr.py",
     "NTXentLoss(temperature=0.1)"),
    ("mocov2_resnet50.in1k_100ep_lightly", "mocov2", "https://arxiv.org/abs/2003.04297", "mocov2.py", ""),
):
    _row = _LIGHTLY_ROWS[_name]
    _recipe = (_SIMCLR_RECIPE.format(script=_script, loss=_loss) if _method != "mocov2" else
               "lightly's benchmarks/imagenet/resnet50/mocov2.py with main.py: torchvision resnet50 (fc = Identity) "
               "and a momentum copy (m 0.999), MoCo projection head, NTXentLoss(temperature=0.2) with a 65536 x 128 "
               "memory bank, SGD lr 0.03 x batch/256, momentum 0.9, weight decay 1e-4, MoCoV2Transform, "
               "total batch 256, 100 epochs, 16-bit mixed precision")
    _register(
        Release(
            name=_name,
            format="lightly",
            arch="resnet50",
            filename=f"{_name}.ckpt",
            sources=(UrlSource(url=_LIGHTLY_URLS[_name], page=_LIGHTLY_PAGE + "#imagenet1k", quote=_row),),
            trained_by="lightly (lightly-ai/lightly's ImageNet benchmark), with lightly's own recipe, not the paper's authors",
            recipe=_recipe + f" ({_LIGHTLY_CODE}; today's code, which may differ from the code of the run)",
            licence_page="https://github.com/lightly-ai/lightly/blob/e8d317fc5a87f4387a85a35e689869039ec249ee/pyproject.toml",
            licence_quote='    "License :: OSI Approved :: MIT License",',
            reported=lightly_reported(_row),
            reported_source="lightly's ImageNet1k benchmark table (batch 256, 100 epochs; linear and fine-tune "
                            "following SimCLR, kNN following InstDisc)",
            reported_quote=_row,
        ),
        method=_method,
        paper=_paper,
        epochs=100,
        license="mit",
        notes=(
            "A third-party run: lightly trained it with its own SimCLR-based benchmark recipe (batch 256, 100 epochs), "
            "not the paper's setting, so its numbers are not the paper's. Licence: lightly's repository licence "
            "(MIT, LICENSE.txt); the benchmark page states no separate terms for the checkpoints. No checksum is "
            "published. PyTorch Lightning .ckpt, read with torch.load(weights_only=True) (backbone.* of state_dict)."
            if _method != "mocov2" else
            "A third-party run: lightly trained it with its own MoCo v2 benchmark recipe (batch 256, 100 epochs), "
            "not the paper's 200-epoch setting. Licence: lightly's repository licence (MIT, LICENSE.txt); the "
            "benchmark page states no separate terms for the checkpoints. No checksum is published. PyTorch "
            "Lightning .ckpt, read with torch.load(weights_only=True) (backbone.* of state_dict)."
        ),
    )

# SiMo (EqCo, Zhu et al.): no published ImageNet weights were found. V2AI/SelfSup's README reports
# "SiMo | 200e | 256 | 68.1" without a download link, so there is no entry to register.
