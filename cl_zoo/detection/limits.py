"""What each number of a detection run may be, checked the same way for both engines and the API.

A value outside these ranges has no meaning (``--freeze-at 9``: ResNets have stages up to 5) or
cannot run (a NaN learning rate, 10^6 px images), so it is refused before data is read, a model
is built or detectron2 is launched, as one line naming the option.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cl_zoo.validation import MAX_SEED, InvalidValueError, check_count, check_number, check_numbers

_ITERS = 100_000_000
_SIDE = (32, 4096)  # pixels of an image's shorter side; the protocols use 480-800

# option destination -> check_number bounds (``list``: each item of a comma-separated option)
LIMITS: dict[str, dict[str, Any]] = {
    "freeze_at": dict(low=0, high=5, integer=True),  # 1: the stem, N in 2-5: the stem and res2..resN
    "batch_size": dict(low=1, high=4096, integer=True),
    "lr": dict(low=0, low_open=True, high=100),
    "momentum": dict(low=0, high=1, high_open=True),
    "weight_decay": dict(low=0, high=1),
    "gamma": dict(low=0, low_open=True, high=1),
    "max_iter": dict(low=0, high=_ITERS, integer=True),
    "steps": dict(low=0, high=_ITERS, integer=True, list=True),
    "warmup_iters": dict(low=0, high=_ITERS, integer=True),
    "warmup_factor": dict(low=0, high=1),
    "min_sizes_train": dict(low=_SIDE[0], high=_SIDE[1], integer=True, list=True),
    "min_size_test": dict(low=_SIDE[0], high=_SIDE[1], integer=True),
    "max_size": dict(low=_SIDE[0], high=2 * _SIDE[1], integer=True),
    "rois_per_image": dict(low=1, high=100_000, integer=True),
    "proposals_test": dict(low=1, high=100_000, integer=True),
    "checkpoint_period": dict(low=0, high=_ITERS, integer=True),
    "workers": dict(low=0, high=1024, integer=True),
    "seed": dict(low=0, high=MAX_SEED, integer=True),
    "val_limit": dict(low=1, high=_ITERS, integer=True),
    "num_gpus": dict(low=1, high=1024, integer=True),
}

_FLAGS = {"min_sizes_train": "--min-size-train"}


def option_flag(key: str) -> str:
    """The command-line option that sets destination ``key``."""
    return _FLAGS.get(key, "--" + key.replace("_", "-"))


def check_detection_values(values: Mapping[str, Any], *, as_flags: bool = False) -> None:
    """Every known key of ``values`` that is not None inside :data:`LIMITS`; steps also increasing.

    ``as_flags`` names a bad value by its option (``--freeze-at``), else by its field name."""
    for key, value in values.items():
        bounds = LIMITS.get(key)
        if bounds is None or value is None:
            continue
        name = option_flag(key) if as_flags else key
        bounds = dict(bounds)
        if bounds.pop("list", False):
            check_numbers(name, value, **bounds)
            continue
        if bounds.get("low") == 1 and bounds.get("integer"):
            check_count(name, value, high=bounds.get("high"))
        else:
            check_number(name, value, **bounds)
    steps = values.get("steps")
    if steps is not None and list(steps) != sorted(steps):
        raise InvalidValueError(f"{option_flag('steps') if as_flags else 'steps'} must increase, got {list(steps)}")
