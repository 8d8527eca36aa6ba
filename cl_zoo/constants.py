"""Facts about the zoo that need no torch: normalisation statistics and the methods' papers.

A leaf below everything (the registry, the augmentations, the model card, the pretrained tables), so
that ``cl-zoo models`` / ``info`` and ``import cl_zoo`` can read them without importing torch, and so
that each value has one home.
"""

from __future__ import annotations

from typing import NamedTuple

# ImageNet statistics as torchvision publishes them for its pretrained weights
# (https://pytorch.org/vision/stable/models.html: "normalized using mean = [0.485, 0.456, 0.406] and
# std = [0.229, 0.224, 0.225]"); timm's IMAGENET_DEFAULT_MEAN/STD are the same numbers.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# CIFAR-10 training-set per-channel mean/std (computed over its 50,000 training images); the one copy
# the registry, the architectures table (cl_zoo.models.archs) and the augmentations import.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)

class Paper(NamedTuple):
    """A method's paper: the citation line, its BibTeX and its arXiv id (the Hub links an
    ``arxiv:<id>`` tag on a model card to the paper's page)."""

    citation: str
    bibtex: str
    arxiv: str


def _paper(citation: str, key: str, kind: str, fields: str, arxiv: str) -> Paper:
    bibtex = f"@{kind}{{{key},\n{fields}\n  eprint={{{arxiv}}},\n  archivePrefix={{arXiv}}\n}}"
    return Paper(citation, bibtex, arxiv)


# Method -> its paper, for model cards and registered entries' ``paper``. The arXiv ids: CMC, SimCLR
# and MoCo v2 as the methods' papers cite them ("arXiv preprint arXiv:1906.05849", "arXiv:2002.05709",
# "arXiv:2003.04297" in the JCL, DCL and EqCo reference lists); JCL, DCL, EqCo and CACR as the
# releases of cl_zoo/models/releases.py link them (their own abstract pages).
PAPERS: dict[str, Paper] = {
    "jcl": _paper(
        "Joint Contrastive Learning with Infinite Possibilities (Cai et al., NeurIPS 2020)", "cai2020jcl", "inproceedings",
        "  title={Joint Contrastive Learning with Infinite Possibilities},\n"
        "  author={Cai, Qi and Wang, Yu and Pan, Yingwei and Yao, Ting and Mei, Tao},\n"
        "  booktitle={NeurIPS},\n  year={2020},", "2009.14776",
    ),
    "dcl": _paper(
        "Decoupled Contrastive Learning (Yeh et al., ECCV 2022)", "yeh2022dcl", "inproceedings",
        "  title={Decoupled Contrastive Learning},\n"
        "  author={Yeh, Chun-Hsiao and Hong, Cheng-Yao and Hsu, Yen-Chi and Liu, Tyng-Luh and Chen, Yubei and LeCun, Yann},\n"
        "  booktitle={ECCV},\n  year={2022},", "2110.06848",
    ),
    "simo": _paper(
        "EqCo: Equivalent Rules for Self-supervised Contrastive Learning (Zhu et al., 2020)", "zhu2020eqco", "article",
        "  title={EqCo: Equivalent Rules for Self-supervised Contrastive Learning},\n"
        "  author={Zhu, Benjin and Huang, Junqiang and Li, Zeming and Zhang, Xiangyu and Sun, Jian},\n"
        "  journal={arXiv:2010.01929},\n  year={2020},", "2010.01929",
    ),
    "cmc": _paper(
        "Contrastive Multiview Coding (Tian et al., ECCV 2020)", "tian2020cmc", "inproceedings",
        "  title={Contrastive Multiview Coding},\n"
        "  author={Tian, Yonglong and Krishnan, Dilip and Isola, Phillip},\n  booktitle={ECCV},\n  year={2020},",
        "1906.05849",
    ),
    "cacr": _paper(
        "Contrastive Attraction and Contrastive Repulsion for Representation Learning (Zheng et al., TMLR 2023)",
        "zheng2023cacr", "article",
        "  title={Contrastive Attraction and Contrastive Repulsion for Representation Learning},\n"
        "  author={Zheng, Huangjie and Chen, Xu and Yao, Jiangchao and Yang, Hongxia and Li, Chunyuan and Zhang, Ya and Zhang, Hao and Tsang, Ivor and Zhou, Jingren and Zhou, Mingyuan},\n"
        "  journal={TMLR},\n  year={2023},", "2105.03746",
    ),
    "simclr": _paper(
        "A Simple Framework for Contrastive Learning of Visual Representations (Chen et al., ICML 2020)",
        "chen2020simclr", "inproceedings",
        "  title={A Simple Framework for Contrastive Learning of Visual Representations},\n"
        "  author={Chen, Ting and Kornblith, Simon and Norouzi, Mohammad and Hinton, Geoffrey},\n  booktitle={ICML},\n  year={2020},",
        "2002.05709",
    ),
    "mocov2": _paper(
        "Improved Baselines with Momentum Contrastive Learning (Chen et al., 2020)", "chen2020mocov2", "article",
        "  title={Improved Baselines with Momentum Contrastive Learning},\n"
        "  author={Chen, Xinlei and Fan, Haoqi and Girshick, Ross and He, Kaiming},\n  journal={arXiv:2003.04297},\n  year={2020},",
        "2003.04297",
    ),
}
PAPERS["dclw"] = PAPERS["dcl"]
PAPERS["eqco"] = PAPERS["simo"]
PAPERS["moco"] = PAPERS["mocov2"]
