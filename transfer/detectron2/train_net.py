#!/usr/bin/env python
"""detectron2 launcher for the MoCo detection protocol with cl-zoo backbones.

``cl-zoo detect --engine detectron2`` runs it (``--dry-run`` prints the exact command); by hand,
after ``cl-zoo export detectron2 MODEL model.pkl``::

    python train_net.py --config-file configs/pascal_voc_R_50_C4_24k.yaml --num-gpus 8 \
        MODEL.WEIGHTS model.pkl OUTPUT_DIR output/voc_trial0 SEED 0

Beyond detectron2's stock trainer it adds what the protocol and users' own data need:

* ``Res5ROIHeadsExtraNorm``: the R50-C4 box head with one more normalisation layer (of the
  backbone's ``RESNETS.NORM`` type) after the last res5 block, as in the MoCo paper;
* ``--voc NAME DIR SPLIT`` / ``--coco NAME JSON IMAGES``: register a dataset of one's own with
  detectron2's ``register_pascal_voc`` / ``register_coco_instances`` under NAME, to be named in
  ``DATASETS.TRAIN`` / ``DATASETS.TEST``; VOC folders are labelled with ``--voc-classes`` (default:
  the 20 PASCAL classes) and scored with the VOC2007 11-point metric;
* the evaluator each dataset's metadata asks for (``evaluator_type``): COCO's for COCO files and
  detectron2's builtin ``coco_*``, the PASCAL VOC one (AP, AP50, AP75) for VOC folders and ``voc_*``;
* ``OUTPUT_DIR/eval_results.json``: the latest evaluation's results, ``{dataset: {"bbox": {metric:
  value}}}``, written whole (temporary name, then rename) by the main process, so ``cl-zoo detect``
  reads numbers from a file instead of scraping the log.

detectron2 is not a cl-zoo dependency; install it following its INSTALL.md.
"""

from __future__ import annotations

import json
import os

from detectron2.checkpoint import DetectionCheckpointer
from detectron2.config import get_cfg
from detectron2.data import MetadataCatalog
from detectron2.data.datasets import register_coco_instances, register_pascal_voc
from detectron2.data.datasets.pascal_voc import CLASS_NAMES as PASCAL_CLASSES
from detectron2.utils import comm
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
        kind = MetadataCatalog.get(dataset_name).get("evaluator_type", None)
        if kind == "coco":
            return COCOEvaluator(dataset_name, output_dir=folder)
        if kind == "pascal_voc":
            return PascalVOCDetectionEvaluator(dataset_name)
        raise ValueError(f"no evaluator for dataset {dataset_name!r} (evaluator_type {kind!r}; expected coco or pascal_voc)")

    @classmethod
    def test(cls, cfg, model, evaluators=None):
        results = super().test(cfg, model, evaluators)
        if comm.is_main_process() and results:
            write_results(cfg.OUTPUT_DIR, results if len(cfg.DATASETS.TEST) > 1 else {cfg.DATASETS.TEST[0]: results})
        return results


def write_results(folder, results):
    """``eval_results.json`` in ``folder``, replaced whole: a reader never sees half a file."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "eval_results.json")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, default=float)
    os.replace(tmp, path)


def register_datasets(args):
    """The --voc / --coco datasets, registered in every process (detectron2 spawns one per GPU)."""
    classes = args.voc_classes.split(",") if args.voc_classes else list(PASCAL_CLASSES)
    for name, folder, split in args.voc:
        # Year 2007: PascalVOCDetectionEvaluator then uses the VOC07 11-point metric of the protocol.
        register_pascal_voc(name, folder, split, 2007, classes)
        MetadataCatalog.get(name).evaluator_type = "pascal_voc"
    for name, json_file, images in args.coco:
        register_coco_instances(name, {}, json_file, images)
    return classes


def setup(args):
    cfg = get_cfg()
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)
    cfg.freeze()
    default_setup(cfg, args)
    return cfg


def main(args):
    cfg = setup(args)
    classes = register_datasets(args)
    voc_names = {name for name, _, _ in args.voc}
    if voc_names & set(cfg.DATASETS.TRAIN) and cfg.MODEL.ROI_HEADS.NUM_CLASSES != len(classes):
        raise SystemExit(f"error: MODEL.ROI_HEADS.NUM_CLASSES is {cfg.MODEL.ROI_HEADS.NUM_CLASSES} but the --voc "
                         f"datasets have {len(classes)} classes ({','.join(classes)})")
    if args.eval_only:
        model = Trainer.build_model(cfg)
        DetectionCheckpointer(model, save_dir=cfg.OUTPUT_DIR).resume_or_load(cfg.MODEL.WEIGHTS, resume=args.resume)
        return Trainer.test(cfg, model)
    trainer = Trainer(cfg)
    trainer.resume_or_load(resume=args.resume)
    return trainer.train()


def argument_parser():
    parser = default_argument_parser()
    parser.add_argument("--voc", nargs=3, action="append", default=[], metavar=("NAME", "DIR", "SPLIT"),
                        help="register a PASCAL VOC folder (Annotations/, JPEGImages/<id>.jpg, "
                             "ImageSets/Main/SPLIT.txt) as dataset NAME; repeatable")
    parser.add_argument("--voc-classes", default=None,
                        help="comma-separated class names of the --voc datasets (default: the 20 PASCAL classes)")
    parser.add_argument("--coco", nargs=3, action="append", default=[], metavar=("NAME", "JSON", "IMAGES"),
                        help="register a COCO instances file and its image folder as dataset NAME; repeatable")
    return parser


if __name__ == "__main__":
    arguments = argument_parser().parse_args()
    launch(
        main,
        arguments.num_gpus,
        num_machines=arguments.num_machines,
        machine_rank=arguments.machine_rank,
        dist_url=arguments.dist_url,
        args=(arguments,),
    )
