"""Contrastive losses, one module per method; each cites the paper and equation it implements."""

from cl_zoo.losses.cacr import CACRLoss, cacr_cross_view_loss, cacr_loss, cacr_multiview_loss
from cl_zoo.losses.cmc import CMCLoss, MemoryBank, bank_nce_loss, bank_softmax_loss, cmc_bank_loss, cmc_loss
from cl_zoo.losses.dcl import DCLLoss, DCLWLoss, dcl, dclw, dclw_weights
from cl_zoo.losses.eqco import EqCoLoss, SiMoLoss, eqco_loss, eqco_margin, simo_loss
from cl_zoo.losses.jcl import JCLLoss, jcl_loss, lambda_schedule
from cl_zoo.losses.infonce import InfoNCELoss, NTXentLoss, info_nce, nt_xent

__all__ = [
    "CACRLoss",
    "CMCLoss",
    "DCLLoss",
    "DCLWLoss",
    "EqCoLoss",
    "InfoNCELoss",
    "JCLLoss",
    "MemoryBank",
    "NTXentLoss",
    "SiMoLoss",
    "bank_nce_loss",
    "bank_softmax_loss",
    "cacr_cross_view_loss",
    "cacr_loss",
    "cacr_multiview_loss",
    "cmc_bank_loss",
    "cmc_loss",
    "dcl",
    "dclw",
    "dclw_weights",
    "eqco_loss",
    "eqco_margin",
    "info_nce",
    "jcl_loss",
    "lambda_schedule",
    "nt_xent",
    "simo_loss",
]
