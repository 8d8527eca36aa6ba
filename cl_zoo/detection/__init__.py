"""Detection transfer: datasets (VOC, COCO), Faster R-CNN on zoo backbones, metrics, training."""

from cl_zoo.detection.datasets import DetectionData, DetectionDataset, load_coco, load_detection_data, load_voc
from cl_zoo.detection.evaluate import coco_evaluate, evaluate_detections, voc_evaluate
from cl_zoo.detection.models import build_faster_rcnn
from cl_zoo.detection.presets import PRESETS, RUN_PRESETS, get_preset, get_run_preset
from cl_zoo.detection.train import DetectionConfig, DetectionInterrupted, DetectionRun, open_datasets, train_detector

__all__ = [
    "DetectionConfig",
    "DetectionData",
    "DetectionDataset",
    "DetectionInterrupted",
    "DetectionRun",
    "PRESETS",
    "RUN_PRESETS",
    "build_faster_rcnn",
    "coco_evaluate",
    "evaluate_detections",
    "get_preset",
    "get_run_preset",
    "load_coco",
    "load_detection_data",
    "load_voc",
    "open_datasets",
    "train_detector",
    "voc_evaluate",
]
