"""Inference engines for feature extraction: torch (always) and OpenVINO (optional extra)."""

from cl_zoo.backends.select import BACKENDS, BackendChoice, openvino_available, resolve_backend

__all__ = ["BACKENDS", "BackendChoice", "openvino_available", "resolve_backend"]
