"""Elementwise math settled before a process computes or forks (the fork server, the launcher's ranks, the
stand-alone reference process): a module of its own, imported by the engine and by the reference alike."""

from __future__ import annotations

import functools


def settle_elementwise_math() -> None:
    """Call each elementwise math function a model uses once, serially, before this process computes or forks.

    The first parallel call of such a function in a fresh process can compute one thread's share with other
    values: in children forked from a server in the fork server's state, gpt_neo's first `tanh` (its gelu_new)
    differed from the second on the first thread's half of the tensor (up to 4.9e-05) in 9 of 200 children, and
    a reference cached that way failed three gpt_neo cells as `numerics`. After one serial call in the parent, 0 of
    200 children differed (docs/findings.md, 2026-12-06). The tensors are too small for a parallel region on
    purpose: an OpenMP thread pool started in the fork server would hang the children it forks."""

    # lazily: the fork server imports this module before torch (suites/engine/worker.py import_cell_machinery)
    import torch
    import torch.nn.functional as functional

    # Not the exact gelu: its float32 kernel starts the thread pool even for 64 values.
    functions = (
        torch.tanh,
        torch.sigmoid,
        torch.exp,
        torch.expm1,
        torch.log,
        torch.log1p,
        torch.log2,
        torch.log10,
        torch.sqrt,
        torch.rsqrt,
        torch.reciprocal,
        torch.sin,
        torch.cos,
        torch.tan,
        torch.asin,
        torch.acos,
        torch.atan,
        torch.sinh,
        torch.cosh,
        torch.erf,
        torch.erfc,
        torch.erfinv,
        torch.lgamma,
        functional.silu,
        functools.partial(functional.gelu, approximate="tanh"),
        functional.softplus,
        functools.partial(torch.softmax, dim=-1),
        functools.partial(torch.log_softmax, dim=-1),
    )
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        sample = torch.linspace(-0.9, 0.9, 64, dtype=dtype)  # inside every domain (asin, acos, erfinv: |x| < 1)
        for function in functions:
            try:
                function(sample)
            except (RuntimeError, NotImplementedError):  # not implemented for this dtype on this device: never used
                pass
