"""The CPU kernels' fake (meta) implementations, which torch.compile traces through, are registered by
build.load whenever a kernel's library loads, whatever was imported before: checked in fresh processes
(a registration is for the life of a process), loading with nothing else imported, and after importing the
kernels' Python modules first."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvloop.engine.kernels.cpu import build

KERNELS = ("paged_decode", "linear_bf16w")

CALL_ON_FAKES = """
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
{imports}
from kvloop.engine.kernels.cpu import build
assert all(build.load(k) for k in {kernels!r}), [build.unavailable_reason(k) for k in {kernels!r}]
with FakeTensorMode():
    q, k = torch.empty(3, 6, 64), torch.empty(10, 16, 2, 64, dtype=torch.bfloat16)
    idx = [torch.zeros(n, dtype=torch.long) for n in (4, 2, 2, 3, 5)]
    out, lse = torch.ops.kvloop_cpu.paged_decode(q, k, k, *idx, 0.125, 512)
    assert out.shape == (3, 6, 64) and lse.shape == (3, 6), (out.shape, lse.shape)
    assert out.dtype == torch.float32, out.dtype
    out, lse = torch.ops.kvloop_cpu.paged_attention(q, k, k, *idx, 0.125, 512)
    assert out.shape == (5, 6, 64) and lse.shape == (5, 6), (out.shape, lse.shape)
    y = torch.ops.kvloop_cpu.linear_bf16w(torch.empty(4, 32), torch.empty(3, 32, 16, dtype=torch.bfloat16),
                                          40, None)
    assert y.shape == (4, 40), y.shape
print("traced")
"""


@pytest.fixture(scope="module", autouse=True)
def kernels() -> None:
    for kernel in KERNELS:
        if not build.load(kernel, build=True):
            pytest.skip(f"CPU kernel {kernel} unavailable: {build.unavailable_reason(kernel)}")


@pytest.mark.parametrize("imports", ["", "from kvloop.engine.kernels.cpu import linear_bf16w, paged_decode"],
                         ids=["load_alone", "modules_imported_first"])
def test_fakes_are_registered_when_the_kernels_load(imports: str):
    code = CALL_ON_FAKES.format(imports=imports, kernels=KERNELS)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "traced" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
