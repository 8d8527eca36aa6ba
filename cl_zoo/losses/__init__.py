"""Contrastive losses, one module per method; each cites the paper and equation it implements."""

from cl_zoo.losses.dcl import DCLLoss, DCLWLoss, dcl, dclw, dclw_weights
from cl_zoo.losses.infonce import InfoNCELoss, NTXentLoss, info_nce, nt_xent

__all__ = [
    "DCLLoss",
    "DCLWLoss",
    "InfoNCELoss",
    "NTXentLoss",
    "dcl",
    "dclw",
    "dclw_weights",
    "info_nce",
    "nt_xent",
]
