"""Facts about the zoo that need no torch: normalisation statistics and the methods' papers.

A leaf below everything (the registry, the augmentations, the model card, the pretrained tables), so
that ``cl-zoo models`` / ``info`` and ``import cl_zoo`` can read them without importing torch, and so
that each value has one home.
"""

from __future__ import annotations

# ImageNet statistics as torchvision publishes them for its pretrained weights
# (https://pytorch.org/vision/stable/models.html: "normalized using mean = [0.485, 0.456, 0.406] and
# std = [0.229, 0.224, 0.225]"); timm's IMAGENET_DEFAULT_MEAN/STD are the same numbers.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# CIFAR-10 training-set per-channel mean/std (computed over its 50,000 training images); the one copy
# the registry, the architectures table (cl_zoo.models.archs) and the augmentations import.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)

# Method -> (citation line, BibTeX) for model cards and registered entries' ``paper``.
PAPERS: dict[str, tuple[str, str]] = {
    "jcl": (
        "Joint Contrastive Learning with Infinite Possibilities (Cai et al., NeurIPS 2020)",
        "@inproceedings{cai2020jcl,\n  title={Joint Contrastive Learning with Infinite Possibilities},\n"
        "  author={Cai, Qi and Wang, Yu and Pan, Yingwei and Yao, Ting and Mei, Tao},\n"
        "  booktitle={NeurIPS},\n  year={2020}\n}",
    ),
    "dcl": (
        "Decoupled Contrastive Learning (Yeh et al., ECCV 2022)",
        "@inproceedings{yeh2022dcl,\n  title={Decoupled Contrastive Learning},\n"
        "  author={Yeh, Chun-Hsiao and Hong, Cheng-Yao and Hsu, Yen-Chi and Liu, Tyng-Luh and Chen, Yubei and LeCun, Yann},\n"
        "  booktitle={ECCV},\n  year={2022}\n}",
    ),
    "simo": (
        "EqCo: Equivalent Rules for Self-supervised Contrastive Learning (Zhu et al., 2020)",
        "@article{zhu2020eqco,\n  title={EqCo: Equivalent Rules for Self-supervised Contrastive Learning},\n"
        "  author={Zhu, Benjin and Huang, Junqiang and Li, Zeming and Zhang, Xiangyu and Sun, Jian},\n"
        "  journal={arXiv:2010.01929},\n  year={2020}\n}",
    ),
    "cmc": (
        "Contrastive Multiview Coding (Tian et al., ECCV 2020)",
        "@inproceedings{tian2020cmc,\n  title={Contrastive Multiview Coding},\n"
        "  author={Tian, Yonglong and Krishnan, Dilip and Isola, Phillip},\n  booktitle={ECCV},\n  year={2020}\n}",
    ),
    "cacr": (
        "Contrastive Attraction and Contrastive Repulsion for Representation Learning (Zheng et al., TMLR 2023)",
        "@article{zheng2023cacr,\n  title={Contrastive Attraction and Contrastive Repulsion for Representation Learning},\n"
        "  author={Zheng, Huangjie and Chen, Xu and Yao, Jiangchao and Yang, Hongxia and Li, Chunyuan and Zhang, Ya and Zhang, Hao and Tsang, Ivor and Zhou, Jingren and Zhou, Mingyuan},\n"
        "  journal={TMLR},\n  year={2023}\n}",
    ),
    "simclr": (
        "A Simple Framework for Contrastive Learning of Visual Representations (Chen et al., ICML 2020)",
        "@inproceedings{chen2020simclr,\n  title={A Simple Framework for Contrastive Learning of Visual Representations},\n"
        "  author={Chen, Ting and Kornblith, Simon and Norouzi, Mohammad and Hinton, Geoffrey},\n  booktitle={ICML},\n  year={2020}\n}",
    ),
    "mocov2": (
        "Improved Baselines with Momentum Contrastive Learning (Chen et al., 2020)",
        "@article{chen2020mocov2,\n  title={Improved Baselines with Momentum Contrastive Learning},\n"
        "  author={Chen, Xinlei and Fan, Haoqi and Girshick, Ross and He, Kaiming},\n  journal={arXiv:2003.04297},\n  year={2020}\n}",
    ),
}
PAPERS["dclw"] = PAPERS["dcl"]
PAPERS["eqco"] = PAPERS["simo"]
PAPERS["moco"] = PAPERS["mocov2"]
