"""Training data: ImageFolder/archives/named datasets, decoded uint8 tensors, batched augmentations.

The names below are imported on first use (:mod:`cl_zoo.lazy`): embedding reads images through
:mod:`cl_zoo.data.images` and must not pay for :mod:`cl_zoo.data.augment`, whose
``torchvision.ops`` import brings all of torchvision and ``torch._dynamo`` (1.4-1.6 s on 2 cores).
"""

from cl_zoo.lazy import lazy_exports

_EXPORTS = {
    "AugmentConfig": "cl_zoo.data.augment:AugmentConfig",
    "ViewGenerator": "cl_zoo.data.augment:ViewGenerator",
    "augment": "cl_zoo.data.augment:augment",
    "preset": "cl_zoo.data.augment:preset",
    "IMAGE_EXTENSIONS": "cl_zoo.data.folder:IMAGE_EXTENSIONS",
    "ImageFolderData": "cl_zoo.data.folder:ImageFolderData",
    "open_image_folder": "cl_zoo.data.folder:open_image_folder",
    "open_named_dataset": "cl_zoo.data.folder:open_named_dataset",
    "scan_image_folder": "cl_zoo.data.folder:scan_image_folder",
    "decode_to_tensor": "cl_zoo.data.memory:decode_to_tensor",
    "load_folder_tensor": "cl_zoo.data.memory:load_folder_tensor",
    "NAMED_DATASETS": "cl_zoo.data.named:NAMED_DATASETS",
    "extract_archive": "cl_zoo.data.archive:extract_archive",
}
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)

__all__ = sorted(_EXPORTS)
