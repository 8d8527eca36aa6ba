"""CMC (Tian, Krishnan, Isola, "Contrastive Multiview Coding", ECCV 2020), L + ab views.

The backbone is a :class:`cl_zoo.models.cmc_dual.CMCDualEncoder`: one encoder per colour view, and
``forward_views`` splits an RGB crop into L and ab and returns both pooled features. The two views
of an image come from the *same* crop by default (``view_crops="shared"``, the authors' ImageNet
code), so the data pipeline produces one augmented view per image (``num_views = 1``, the ``cmc``
preset: crop + flip, RGB in [0, 1]). ``view_crops="independent"`` draws two crops per image and takes
L from the first and ab from the second: the supplement credits contrastive learning's edge over
prediction partly to "random jittering and cropping between views", which makes the pair contrast in
space as well as across channels. The exported representation is the concatenation of both
encoders' features either way.

Each view gets its own projection head (CMC's code: one linear layer to 128-d, ``head_layers=1``) and
the two embeddings are contrasted either

* in-batch (``negatives="in_batch"``): the symmetric InfoNCE of Eq. 4 against the other images of the
  (globally gathered) batch, or
* with a memory bank (``negatives="memory_bank"``, Sec. 3.4): one entry per training image and view,
  momentum 0.5, K sampled negatives (16384 on ImageNet), scored with NCE (``objective="nce"``,
  supplement B.1) or a (K+1)-way softmax (``objective="softmax"``). ``bank_size`` must be the number
  of training images (``index`` addresses it). Under DDP every rank scores its local batch and then
  writes the gathered batch into its bank, so all banks stay identical.

The paper's default is two views (L, ab) and tau 0.07.

With a plain single-input backbone (e.g. ``resnet18_cifar``) the views are instead ``num_views``
augmentations of the image through one shared encoder and head, contrasted over the core-view
(Eq. 7) or full graph (Eq. 8): the "CMC (K=4)" multi-positive baseline of the CACR paper's
small-scale tables.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cl_zoo.losses.cmc import MemoryBank, cmc_bank_loss, cmc_loss
from cl_zoo.methods.base import ContrastiveMethod
from cl_zoo.methods.heads import ProjectionHead, feature_dim
from cl_zoo.distributed import gather


class CMC(ContrastiveMethod):
    """CMC with a dual (L, ab) encoder; in-batch or memory-bank negatives."""

    name = "cmc"
    default_augment = "cmc"

    def __init__(
        self,
        backbone: nn.Module,
        *,
        temperature: float = 0.07,
        negatives: str = "in_batch",
        objective: str = "softmax",
        num_negatives: int = 16384,
        bank_size: int | None = None,
        bank_momentum: float = 0.5,
        head_hidden_dim: int | None = None,
        head_out_dim: int = 128,
        head_layers: int = 1,
        head_bn: bool = False,
        num_views: int | None = None,
        graph: str = "core",
        view_crops: str = "shared",
        **base_kwargs: object,
    ) -> None:
        colour_views = hasattr(backbone, "forward_views") and hasattr(backbone, "view_features")
        if view_crops not in ("shared", "independent"):
            raise ValueError(f"view_crops must be 'shared' (L and ab of one crop) or 'independent' (one crop each), got {view_crops!r}")
        if colour_views:
            if num_views not in (None, 1):
                raise ValueError(
                    "with a dual (L, ab) backbone CMC takes one augmented crop per image: num_views must be 1 "
                    "(view_crops='independent' draws a second crop for ab)"
                )
            view_dims = [int(d) for d in backbone.view_features]  # type: ignore[attr-defined]
            n_aug = 1 if view_crops == "shared" else 2
        elif view_crops != "shared":
            raise ValueError("view_crops applies to the dual (L, ab) backbone; augmentation views are separate crops already")
        else:
            n_aug = 2 if num_views is None else int(num_views)
            if n_aug < 2:
                raise ValueError(f"CMC on augmentation views needs num_views >= 2, got {n_aug}")
            view_dims = [feature_dim(backbone)]
        if not colour_views and base_kwargs.get("augment") is None:
            base_kwargs["augment"] = "simclr"  # RGB augmentation views, not the [0, 1] crop of the cmc preset
        super().__init__(backbone, num_views=n_aug, **base_kwargs)  # type: ignore[arg-type]
        if graph not in ("core", "full"):
            raise ValueError(f"graph must be 'core' (Eq. 7) or 'full' (Eq. 8), got {graph!r}")
        self.graph = graph
        self.colour_views = colour_views
        self.view_crops = view_crops
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if negatives not in ("in_batch", "memory_bank"):
            raise ValueError(f"negatives must be 'in_batch' or 'memory_bank', got {negatives!r}")
        if objective not in ("nce", "softmax"):
            raise ValueError(f"objective must be 'nce' or 'softmax', got {objective!r}")
        self.temperature = float(temperature)
        self.negatives = negatives
        self.objective = objective
        self.num_negatives = int(num_negatives)
        self.heads = nn.ModuleList(
            ProjectionHead(int(d), head_hidden_dim, head_out_dim, num_layers=head_layers, batch_norm=head_bn)
            for d in view_dims
        )
        self.bank: MemoryBank | None = None
        if negatives == "memory_bank":
            if bank_size is None or bank_size < 2:
                raise ValueError("negatives='memory_bank' needs bank_size = the number of training images")
            if self.num_negatives < 1:
                raise ValueError(f"num_negatives must be >= 1, got {num_negatives}")
            self.bank = MemoryBank(
                bank_size, head_out_dim, num_views=len(view_dims) if self.colour_views else n_aug, momentum=bank_momentum
            )

    def check_dataset_size(self, num_images: int) -> None:
        """The bank is indexed by dataset index: it needs an entry per training image."""
        if self.bank is not None and num_images > self.bank.num_entries:
            raise ValueError(
                f"the memory bank has {self.bank.num_entries} entries (method_args.bank_size) but the training set "
                f"has {num_images} images; set method_args.bank_size={num_images}"
            )

    def embed_views(self, views: list[Tensor]) -> list[Tensor]:
        """One embedding per CMC view: (L, ab) of the crop (or of the two crops), or each augmented view."""
        if self.colour_views:
            feats = self.backbone.forward_views(*views)  # type: ignore[operator]
            return [head(f) for head, f in zip(self.heads, feats)]
        return [self.heads[0](self.backbone.forward_features(v)) for v in views]

    def training_step(
        self, views: list[Tensor], index: Tensor, epoch_progress: float
    ) -> tuple[Tensor, dict[str, Tensor]]:
        self.check_views(views)
        z = self.embed_views(views)
        if self.bank is None:
            z_all = [gather(v, grad=True) for v in z]
            loss = cmc_loss(z_all, self.temperature, self.graph)
        else:
            loss = cmc_bank_loss(
                z, index, self.bank, self.num_negatives, self.temperature, self.objective, self.graph, update=False
            )
            with torch.no_grad():
                index_all = gather(index.to(z[0].device), grad=False)
                for v, emb in enumerate(z):
                    self.bank.update(v, index_all, gather(emb.float(), grad=False))
        with torch.no_grad():
            pos = F.cosine_similarity(z[0].detach().float(), z[1].detach().float(), dim=1).mean()
        return loss, self.logs(loss=loss, pos_sim=pos)

    def extra_repr(self) -> str:
        return (
            f"temperature={self.temperature}, negatives={self.negatives!r}, objective={self.objective!r}, "
            f"num_negatives={self.num_negatives}, graph={self.graph!r}, view_crops={self.view_crops!r}, "
            + super().extra_repr()
        )
