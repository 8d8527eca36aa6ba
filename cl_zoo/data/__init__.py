"""Training data: ImageFolder/archives/named datasets, decoded uint8 tensors, batched augmentations."""

from cl_zoo.data.archive import extract_archive
from cl_zoo.data.augment import AugmentConfig, ViewGenerator, augment, preset
from cl_zoo.data.folder import IMAGE_EXTENSIONS, ImageFolderData, open_image_folder, open_named_dataset, scan_image_folder
from cl_zoo.data.memory import decode_to_tensor, load_folder_tensor
from cl_zoo.data.named import NAMED_DATASETS

__all__ = [
    "AugmentConfig",
    "ViewGenerator",
    "augment",
    "preset",
    "IMAGE_EXTENSIONS",
    "ImageFolderData",
    "NAMED_DATASETS",
    "decode_to_tensor",
    "extract_archive",
    "load_folder_tensor",
    "open_image_folder",
    "open_named_dataset",
    "scan_image_folder",
]
