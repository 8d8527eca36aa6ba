#!/usr/bin/env python
"""detectron2 launcher for the MoCo detection protocol with cl-zoo backbones.

Run from this folder after ``cl-zoo export detectron2 MODEL model.pkl``::

    python train_net.py --config-file configs/pascal_voc_R_50_C4_24k.yaml --num-gpus 8 \
        MODEL.WEIGHTS model.pkl OUTPUT_DIR output/voc_trial0 SEED 0

Beyond detectron2's stock trainer it adds two things the protocol needs:

* ``Res5ROIHeadsExtraNorm``: the R50-C4 box head with one more normalisation layer (of the
  backbone's ``RESNETS.NORM`` type) after the last res5 block, as in the MoCo paper;
* an evaluator per dataset: COCO's for ``coco_*`` datasets, the PASCAL VOC one (AP, AP50, AP75
  with the VOC2007 11-point metric on voc_2007_test) for ``voc_*`` datasets.

detectron2 is not a cl-zoo dependency; install it following its INSTALL.md.
"""

from __future__ import annotations

import os

from detectron2.checkpoint import DetectionCheckpointer
from detectron2.config import get_cfg
from detectron2.engine import DefaultTrainer, default_argument_parser, default_setup, launch
from detectron2.evaluation import COCOEvaluator, PascalVOCDetectionEvaluator
from detectron2.layers import get_norm
from detectron2.modeling.roi_heads import ROI_HEADS_REGISTRY, Res5ROIHeads


@ROI_HEADS_REGISTRY.register()
class Res5ROIHeadsExtraNorm(Res5ROIHeads):
    """Res5ROIHeads whose res5 ends with an extra norm layer (MoCo, sec. 4.2)."""

    def __init__(self, cfg, input_shape):
        super().__init__(cfg, input_shape)
        channels = self.res5[-1].out_channels
        self.res5.add_module("norm", get_norm(cfg.MODEL.RESNETS.NORM, channels))


class Trainer(DefaultTrainer):
    @classmethod
    def build_evaluator(cls, cfg, dataset_name, output_folder=None):
        folder = output_folder or os.path.join(cfg.OUTPUT_DIR, "inference")
        if dataset_name.startswith("coco"):
            return COCOEvaluator(dataset_name, output_dir=folder)
        if dataset_name.startswith("voc"):
            return PascalVOCDetectionEvaluator(dataset_name)
        raise ValueError(f"no evaluator for dataset {dataset_name!r} (expected coco_* or voc_*)")


def setup(args):
    cfg = get_cfg()
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)
    cfg.freeze()
    default_setup(cfg, args)
    return cfg


def main(args):
    cfg = setup(args)
    if args.eval_only:
        model = Trainer.build_model(cfg)
        DetectionCheckpointer(model, save_dir=cfg.OUTPUT_DIR).resume_or_load(cfg.MODEL.WEIGHTS, resume=args.resume)
        return Trainer.test(cfg, model)
    trainer = Trainer(cfg)
    trainer.resume_or_load(resume=args.resume)
    return trainer.train()


if __name__ == "__main__":
    arguments = default_argument_parser().parse_args()
    launch(
        main,
        arguments.num_gpus,
        num_machines=arguments.num_machines,
        machine_rank=arguments.machine_rank,
        dist_url=arguments.dist_url,
        args=(arguments,),
    )
