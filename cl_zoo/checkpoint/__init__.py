"""The checkpoint format and everything that moves it: folders, checks, cards, the Hub, publishing.

One concern, one package; each module's public names are the ones the rest of cl-zoo imports:

* :mod:`~cl_zoo.checkpoint.folder`: the on-disk layout (config.json + safetensors + card) and
  :func:`save_pretrained` / :func:`load_folder` (re-exported here);
* :mod:`~cl_zoo.checkpoint.checks`: the checks that treat a folder as untrusted input;
* :mod:`~cl_zoo.checkpoint.card`: the model card (README.md) rendered from config.json;
* :mod:`~cl_zoo.checkpoint.usage`: a card's "How to load" block, read and checked;
* :mod:`~cl_zoo.checkpoint.hub`: where weights come from (bundled, the Hub, releases);
* :mod:`~cl_zoo.checkpoint.publish`: validating and uploading folders to the Hub.

The names below are imported from :mod:`~cl_zoo.checkpoint.folder` on first use (that module
imports torch), so the torch-free modules of this package (``layout``, ``hub``, ``card``,
``timm_compat``, ``checks``) can be imported without it.
"""

from cl_zoo.lazy import lazy_exports

__all__ = [
    "CARD_NAME",
    "CONFIG_NAME",
    "DEFAULT_MAX_SHARD_SIZE",
    "FORMAT_VERSION",
    "INDEX_NAME",
    "WEIGHTS_NAME",
    "MismatchMessages",
    "config_pretrained_cfg",
    "consolidate_weights",
    "load_folder",
    "load_state_dict",
    "load_state_into",
    "model_config",
    "parse_size",
    "read_config",
    "read_headers",
    "save_pretrained",
    "sha256_file",
    "shard_map",
    "upgrade_config",
    "weight_files",
]

__getattr__, __dir__ = lazy_exports(globals(), {name: f"cl_zoo.checkpoint.folder:{name}" for name in __all__})
