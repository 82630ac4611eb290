"""The LiteRT graph check: the float graphs against PyTorch, driven by mtpkit's LiteRT runtime."""

from __future__ import annotations

from .. import ExportJob


def check(manifest, job: ExportJob, ids: list[int]) -> list:
    """The float graphs against PyTorch, driven by mtpkit's LiteRT runtime (export/verify.py check_runtime)."""
    from ...verify import check_runtime

    return check_runtime(manifest, "litert", job.target, job.drafter, ids)
