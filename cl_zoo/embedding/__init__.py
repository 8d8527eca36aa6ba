"""Turning image collections into feature vectors, fast, resumably, and at any size.

The package has one room per concern, and these are the names other modules import:

* :mod:`.inputs` reads what to embed: image files, folders, path lists (txt/jsonl/csv/parquet) and
  WebDataset tar shards, local or through fsspec URLs;
* :mod:`.preprocess` turns a file into the pixels the model was trained on;
* :mod:`.engine` runs the model (torch, OpenVINO fp32/bf16/int8) and :mod:`.extract` is the one
  batched loop every consumer shares (``cl-zoo embed``, ``cl_zoo.embed``, k-NN and linear
  evaluation); :mod:`.progress` makes it resumable and splits it across ``torchrun`` ranks;
* :mod:`.files` writes and reads one embeddings file, :mod:`.shards` a folder of numbered shards
  with a manifest, for collections larger than memory;
* :mod:`.reference` records which model made a set of embeddings.

(The package is ``cl_zoo.embedding`` rather than ``cl_zoo.embed`` because ``cl_zoo.embed`` is the
public function; a package of the same name would be shadowed by it.)
"""

from cl_zoo.embedding.api import embed
from cl_zoo.embedding.checks import NonFiniteFeatureError, check_finite, display_path, model_label
from cl_zoo.embedding.engine import model_fingerprint, prepare_model, resolve_device, resolve_engine
from cl_zoo.embedding.extract import FeatureResult, extract_features
from cl_zoo.embedding.files import (
    LEGACY_PATHS_SIDECAR,
    OUTPUT_SUFFIXES,
    PATHS_SIDECAR,
    load_embeddings,
    path_listing,
    read_metadata,
    read_npy_features,
    read_path_list,
    save_embeddings,
    sidecar,
    write_failures,
    write_path_list,
)
from cl_zoo.embedding.preprocess import Preprocess, decode_images
from cl_zoo.embedding.progress import SavedProgress, saved_progress
from cl_zoo.embedding.reference import (
    input_metadata,
    load_embedding_model,
    model_metadata,
    model_reference,
    resolve_model_reference,
)

__all__ = [
    "LEGACY_PATHS_SIDECAR",
    "OUTPUT_SUFFIXES",
    "PATHS_SIDECAR",
    "FeatureResult",
    "NonFiniteFeatureError",
    "Preprocess",
    "SavedProgress",
    "check_finite",
    "decode_images",
    "display_path",
    "embed",
    "extract_features",
    "input_metadata",
    "load_embedding_model",
    "load_embeddings",
    "model_fingerprint",
    "model_label",
    "model_metadata",
    "model_reference",
    "path_listing",
    "prepare_model",
    "read_metadata",
    "read_npy_features",
    "read_path_list",
    "resolve_device",
    "resolve_engine",
    "resolve_model_reference",
    "save_embeddings",
    "saved_progress",
    "sidecar",
    "write_failures",
    "write_path_list",
]
