"""Detection metrics: COCO AP through pycocotools and the PASCAL VOC07 11-point AP.

Both take the same inputs: the loaded :class:`~cl_zoo.detection.datasets.DetectionData` as ground
truth and, per image, a dict of ``boxes`` (x1 y1 x2 y2 pixels), ``scores`` and ``labels`` (1..K).
Reported numbers are percentages, as in the papers.

VOC: for every class, detections are ranked by score and matched greedily to the unmatched
ground truth with the highest IoU above the threshold; matches to "difficult" objects count as
neither true nor false positives, and difficult objects do not count towards recall. AP is the
11-point interpolated precision of the VOC2007 devkit. detectron2's PascalVOCDetectionEvaluator
(the MoCo protocol) reports AP50, AP75 and "AP" as the mean over IoU 0.50:0.05:0.95 of that VOC AP;
we report the same three as ``voc_AP50``/``voc_AP75``/``voc_AP``.
"""

from __future__ import annotations

import contextlib
import io
from typing import Sequence

import numpy as np

from cl_zoo.detection.datasets import DetectionData
from cl_zoo.optional import require

Detections = Sequence[dict[str, np.ndarray]]  # per sample, aligned with data.samples


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    ix1 = np.maximum(box[0], boxes[:, 0])
    iy1 = np.maximum(box[1], boxes[:, 1])
    ix2 = np.minimum(box[2], boxes[:, 2])
    iy2 = np.minimum(box[3], boxes[:, 3])
    inter = np.clip(ix2 - ix1, 0, None) * np.clip(iy2 - iy1, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / np.maximum(area + areas - inter, np.finfo(np.float64).eps)


def voc07_ap(recall: np.ndarray, precision: np.ndarray) -> float:
    """11-point interpolated AP: mean over r in {0, 0.1, ..., 1} of the best precision at recall >= r."""
    points = []
    for t in np.linspace(0.0, 1.0, 11):
        mask = recall >= t - 1e-12
        points.append(float(precision[mask].max()) if mask.any() else 0.0)
    return float(np.mean(points))


def voc_class_ap(data: DetectionData, detections: Detections, label: int, iou_threshold: float) -> float | None:
    """VOC07 AP of one class; None when the class has no non-difficult ground truth."""
    gt: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    npos = 0
    for i, s in enumerate(data.samples):
        mask = s.labels == label
        boxes, difficult = s.boxes[mask].astype(np.float64), s.difficult[mask]
        gt[i] = (boxes, difficult, np.zeros(len(boxes), dtype=bool))
        npos += int((~difficult).sum())
    if npos == 0:
        return None
    entries = []
    for i, det in enumerate(detections):
        mask = np.asarray(det["labels"]) == label
        for box, score in zip(np.asarray(det["boxes"])[mask], np.asarray(det["scores"])[mask]):
            entries.append((float(score), i, np.asarray(box, dtype=np.float64)))
    if not entries:
        return 0.0
    entries.sort(key=lambda e: -e[0])
    tp = np.zeros(len(entries))
    fp = np.zeros(len(entries))
    for d, (_, i, box) in enumerate(entries):
        boxes, difficult, used = gt[i]
        if len(boxes) == 0:
            fp[d] = 1
            continue
        overlaps = _iou(box, boxes)
        j = int(overlaps.argmax())
        if overlaps[j] > iou_threshold:
            if difficult[j]:
                continue
            if not used[j]:
                tp[d], used[j] = 1, True
            else:
                fp[d] = 1
        else:
            fp[d] = 1
    tp, fp = np.cumsum(tp), np.cumsum(fp)
    recall = tp / npos
    precision = tp / np.maximum(tp + fp, np.finfo(np.float64).eps)
    return voc07_ap(recall, precision)


def voc_evaluate(data: DetectionData, detections: Detections) -> dict[str, float]:
    """VOC07 11-point AP50, AP75 and AP (mean over IoU .50:.95), plus AP50 per class."""
    if len(detections) != len(data.samples):
        raise ValueError(f"{len(detections)} detection lists for {len(data.samples)} images")
    thresholds = [t / 100 for t in range(50, 100, 5)]
    per_threshold: dict[float, list[float]] = {}
    per_class50: dict[str, float] = {}
    for t in thresholds:
        aps = []
        for label, name in enumerate(data.classes, start=1):
            ap = voc_class_ap(data, detections, label, t)
            if ap is None:
                continue
            aps.append(ap)
            if t == 0.5:
                per_class50[name] = 100.0 * ap
        per_threshold[t] = aps
    mean = {t: 100.0 * float(np.mean(v)) if v else 0.0 for t, v in per_threshold.items()}
    result = {"voc_AP50": mean[0.5], "voc_AP75": mean[0.75], "voc_AP": float(np.mean(list(mean.values())))}
    result.update({f"voc_AP50/{name}": ap for name, ap in per_class50.items()})
    return result


def coco_ground_truth(data: DetectionData) -> dict:
    """The ground truth as a COCO dict (difficult/crowd as ``iscrowd`` so COCOeval ignores them)."""
    images, annotations = [], []
    for s in data.samples:
        images.append({"id": int(s.image_id), "width": int(s.width), "height": int(s.height), "file_name": s.name})
        for box, label, diff in zip(s.boxes, s.labels, s.difficult):
            x1, y1, x2, y2 = (float(v) for v in box)
            annotations.append({
                "id": len(annotations) + 1,
                "image_id": int(s.image_id),
                "category_id": int(data.category_ids[int(label) - 1]),
                "bbox": [x1, y1, x2 - x1, y2 - y1],
                "area": (x2 - x1) * (y2 - y1),
                "iscrowd": int(bool(diff)),
            })
    categories = [{"id": int(c), "name": n} for c, n in zip(data.category_ids, data.classes)]
    return {"images": images, "annotations": annotations, "categories": categories}


def coco_evaluate(data: DetectionData, detections: Detections) -> dict[str, float]:
    """COCO AP, AP50, AP75, APs, APm, APl (percent) with pycocotools' COCOeval."""
    require("pycocotools", "COCO AP (detect --engine torchvision)")
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    if len(detections) != len(data.samples):
        raise ValueError(f"{len(detections)} detection lists for {len(data.samples)} images")
    results = []
    for s, det in zip(data.samples, detections):
        for box, score, label in zip(np.asarray(det["boxes"]), np.asarray(det["scores"]), np.asarray(det["labels"])):
            x1, y1, x2, y2 = (float(v) for v in box)
            results.append({
                "image_id": int(s.image_id),
                "category_id": int(data.category_ids[int(label) - 1]),
                "bbox": [x1, y1, x2 - x1, y2 - y1],
                "score": float(score),
            })
    names = ["AP", "AP50", "AP75", "APs", "APm", "APl"]
    if not results:
        return {n: 0.0 for n in names}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
        gt = COCO()
        gt.dataset = coco_ground_truth(data)
        gt.createIndex()
        dt = gt.loadRes(results)
        ev = COCOeval(gt, dt, iouType="bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    # COCOeval reports -1 where a size range has no ground truth: report NaN rather than -100.
    return {n: (100.0 * float(v) if v >= 0 else float("nan")) for n, v in zip(names, ev.stats[:6])}


def evaluate_detections(data: DetectionData, detections: Detections) -> dict[str, float]:
    """Both metric families on any dataset (the VOC ones are the protocol's for VOC data)."""
    metrics = coco_evaluate(data, detections)
    metrics.update(voc_evaluate(data, detections))
    return metrics
