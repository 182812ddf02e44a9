"""Load a GPU with nothing but the driver's libcuda (ctypes): no cupy, no torch.

``busy(seconds, nbytes)`` creates a context, allocates and fills ``nbytes`` of device memory,
runs a spin kernel on every SM for about ``seconds``, then frees the memory and destroys the
context, so the process holds nothing on the device afterwards. The kernel is PTX, which the
driver compiles for whatever board is present.
"""

from __future__ import annotations

import ctypes

_PTX = b"""
.version 6.0
.target sm_50
.address_size 64

.visible .entry spin(.param .u64 cycles)
{
    .reg .u64 %rd<5>;
    .reg .pred %p;
    ld.param.u64 %rd1, [cycles];
    mov.u64 %rd2, %clock64;
LOOP:
    mov.u64 %rd3, %clock64;
    sub.u64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p, %rd4, %rd1;
    @%p bra LOOP;
    ret;
}
"""

_ATTR_CLOCK_RATE_KHZ = 13
_ATTR_SM_COUNT = 16


def _check(code: int, what: str) -> None:
    if code != 0:
        raise RuntimeError(f"{what} failed with CUresult {code}")


def busy(seconds: float, nbytes: int) -> None:
    cuda = ctypes.CDLL("libcuda.so.1")
    _check(cuda.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    _check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    _check(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")
    try:
        ptr = ctypes.c_uint64()
        _check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes)), "cuMemAlloc")
        _check(cuda.cuMemsetD8_v2(ptr, ctypes.c_ubyte(1), ctypes.c_size_t(nbytes)), "cuMemset")
        module = ctypes.c_void_p()
        _check(cuda.cuModuleLoadData(ctypes.byref(module), _PTX), "cuModuleLoadData")
        fn = ctypes.c_void_p()
        _check(cuda.cuModuleGetFunction(ctypes.byref(fn), module, b"spin"), "cuModuleGetFunction")
        khz = ctypes.c_int()
        sms = ctypes.c_int()
        _check(cuda.cuDeviceGetAttribute(ctypes.byref(khz), _ATTR_CLOCK_RATE_KHZ, dev), "attr")
        _check(cuda.cuDeviceGetAttribute(ctypes.byref(sms), _ATTR_SM_COUNT, dev), "attr")
        cycles = ctypes.c_uint64(int(seconds * khz.value * 1000))
        params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(cycles), ctypes.c_void_p))
        _check(
            cuda.cuLaunchKernel(fn, 2 * sms.value, 1, 1, 128, 1, 1, 0, None, params, None),
            "cuLaunchKernel",
        )
        _check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
        _check(cuda.cuMemFree_v2(ptr), "cuMemFree")
    finally:
        cuda.cuCtxDestroy_v2(ctx)


def device_count() -> int:
    """How many devices CUDA shows this process (after ``CUDA_VISIBLE_DEVICES``)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    _check(cuda.cuInit(0), "cuInit")
    n = ctypes.c_int()
    _check(cuda.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
    return int(n.value)
