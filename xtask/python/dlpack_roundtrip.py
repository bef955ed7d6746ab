"""DLPack round trips between PyTorch (and numpy) and cartage, through the C ABI of
`crates/cartage/examples/dlpack_ffi.rs` loaded with ctypes.

Build the library, then run this script with a Python that has torch (numpy alone runs the CPU
numpy cases):

    cargo build --release --example dlpack_ffi -p cartage --all-features
    python3 xtask/python/dlpack_roundtrip.py --lib target/release/examples/libdlpack_ffi.so \
        [--device cpu|cuda|all] [--require-cuda]

Each case goes torch -> cartage -> torch: `torch.utils.dlpack.to_dlpack(t)` gives a capsule
named "dltensor" holding a `DLManagedTensor*`; the pointer is taken out and the capsule renamed
"used_dltensor" (the consumer's duty), cartage imports it without a copy, sums it on its device
and exports the same memory back; that pointer goes into a new "dltensor" capsule, whose
destructor calls the deleter if nobody consumed it, and `torch.from_dlpack` takes it. The case
checks the same `data_ptr()`, shape, strides, dtype, device and values, the sum cartage computed,
and a copy cartage scaled on the device. Two more cases check that the memory stays valid while
cartage holds it after the torch tensor is deleted, and that refused dtypes come back as errors.

CUDA: cartage synchronises its device before every export; before handing a CUDA tensor to
cartage the script synchronises torch's current stream (the C-level exchange carries no stream).

The script ends with a line `N passed, N failed` and exits non-zero on any failure.
"""

import argparse
import ctypes
import gc
import sys

# --- The DLPack structs (dlpack.h), enough to call a deleter. -------------------------------


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


assert ctypes.sizeof(DLTensor) == 48 and ctypes.sizeof(DLManagedTensor) == 64

DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

# --- The capsule API, called with the GIL held. ---------------------------------------------

_api = ctypes.pythonapi
capsule_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api)
)
capsule_set_name = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_SetName", _api))
CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, CAPSULE_DESTRUCTOR)(
    ("PyCapsule_New", _api)
)
# The destructor gets a raw PyObject*: these take it as a plain pointer.
_raw_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_raw_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api)
)

# Names outlive every capsule that uses them (module constants).
DLTENSOR = b"dltensor"
USED_DLTENSOR = b"used_dltensor"

unconsumed_deleted = 0


def _destroy_capsule(capsule):
    """A "dltensor" capsule nobody consumed still owns its tensor: call the deleter."""
    global unconsumed_deleted
    if _raw_is_valid(capsule, DLTENSOR):
        managed = _raw_get_pointer(capsule, DLTENSOR)
        deleter = DLManagedTensor.from_address(managed).deleter
        if deleter:
            DELETER(deleter)(managed)
        unconsumed_deleted += 1


DESTROY_CAPSULE = CAPSULE_DESTRUCTOR(_destroy_capsule)


def take_pointer(capsule):
    """The `DLManagedTensor*` of a fresh "dltensor" capsule, which is marked used."""
    pointer = capsule_get_pointer(capsule, DLTENSOR)
    capsule_set_name(capsule, USED_DLTENSOR)
    return pointer


def wrap_pointer(pointer):
    """A "dltensor" capsule owning `pointer` (its deleter runs if it is never consumed)."""
    return capsule_new(pointer, DLTENSOR, DESTROY_CAPSULE)


# --- The library. ----------------------------------------------------------------------------


class Cartage:
    def __init__(self, path):
        lib = ctypes.CDLL(path)
        lib.cartage_dlpack_last_error.restype = ctypes.c_char_p
        lib.cartage_dlpack_roundtrip.restype = ctypes.c_void_p
        lib.cartage_dlpack_roundtrip.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_double)]
        lib.cartage_dlpack_scaled.restype = ctypes.c_void_p
        lib.cartage_dlpack_scaled.argtypes = [ctypes.c_void_p, ctypes.c_double]
        lib.cartage_dlpack_hold.restype = ctypes.c_void_p
        lib.cartage_dlpack_hold.argtypes = [ctypes.c_void_p]
        lib.cartage_dlpack_held_sum.restype = ctypes.c_double
        lib.cartage_dlpack_held_sum.argtypes = [ctypes.c_void_p]
        lib.cartage_dlpack_release.restype = None
        lib.cartage_dlpack_release.argtypes = [ctypes.c_void_p]
        self.lib = lib

    def _check(self, pointer):
        if not pointer:
            raise RuntimeError("cartage: " + self.lib.cartage_dlpack_last_error().decode())
        return pointer

    def roundtrip(self, capsule):
        """(capsule of the same memory, the sum cartage computed)."""
        total = ctypes.c_double(float("nan"))
        out = self._check(self.lib.cartage_dlpack_roundtrip(take_pointer(capsule), ctypes.byref(total)))
        return wrap_pointer(out), total.value

    def scaled(self, capsule, factor):
        return wrap_pointer(self._check(self.lib.cartage_dlpack_scaled(take_pointer(capsule), factor)))

    def hold(self, capsule):
        return self._check(self.lib.cartage_dlpack_hold(take_pointer(capsule)))

    def held_sum(self, handle):
        return self.lib.cartage_dlpack_held_sum(handle)

    def release(self, handle):
        self.lib.cartage_dlpack_release(handle)


# --- Cases. ----------------------------------------------------------------------------------

results = []


def case(name, fn):
    try:
        fn()
        results.append((name, None))
        print(f"ok   {name}")
    except Exception as e:  # noqa: BLE001 - every failure is reported, then counted
        results.append((name, e))
        print(f"FAIL {name}: {type(e).__name__}: {e}")


def torch_cases(cartage, torch, device):
    from torch.utils import dlpack as tdl

    def export(t):
        if t.device.type == "cuda":
            torch.cuda.current_stream(t.device).synchronize()
        return tdl.to_dlpack(t)

    def sample(dtype):
        g = torch.Generator().manual_seed(7)
        if dtype.is_floating_point:
            return (torch.randn(3, 5, generator=g) * 4).to(dtype).to(device)
        if dtype == torch.bool:
            return (torch.randint(0, 2, (3, 5), generator=g) == 1).to(device)
        return torch.randint(-100 if dtype != torch.uint8 else 0, 100, (3, 5), generator=g).to(dtype).to(device)

    def same_memory_back(t):
        expected_sum = t.double().sum().item()
        back, total = cartage.roundtrip(export(t))
        back = torch.from_dlpack(back)
        assert back.data_ptr() == t.data_ptr(), (hex(back.data_ptr()), hex(t.data_ptr()))
        assert back.shape == t.shape and back.stride() == t.stride(), (back.shape, back.stride(), t.stride())
        assert back.dtype == t.dtype and back.device == t.device, (back.dtype, back.device)
        assert torch.equal(back, t)
        assert abs(total - expected_sum) <= 1e-6 * max(1.0, abs(expected_sum)), (total, expected_sum)
        scaled = torch.from_dlpack(cartage.scaled(export(t), 2.5))
        assert scaled.device == t.device and scaled.dtype == torch.float32
        assert torch.allclose(scaled, t.float() * 2.5, rtol=1e-6, atol=1e-6)
        # Writes through the returned tensor land in the original (the same memory).
        if t.dtype.is_floating_point and t.dim() == 2 and t.is_contiguous():
            back[0, 0] = 42
            assert t[0, 0].item() == 42

    dtypes = [torch.float32, torch.bfloat16, torch.int64, torch.float16, torch.float64, torch.int32, torch.uint8, torch.bool]
    for dtype in dtypes:
        case(f"torch {device} {dtype} round trip", lambda dtype=dtype: same_memory_back(sample(dtype)))

    def views():
        base = torch.arange(48, dtype=torch.float32, device=device).reshape(6, 8)
        same_memory_back(base[1:, ::2].t())  # storage offset 8, strides (2, 8)
        same_memory_back(base[2:4, 3:7])  # offset 19, non-contiguous rows
        same_memory_back(base[:, 1:2].expand(6, 5))  # a broadcast dimension (stride 0)
        same_memory_back(base[3, 5])  # a scalar view

    case(f"torch {device} views with offsets and strides", views)

    def kept_alive_by_cartage():
        t = torch.arange(1 << 16, dtype=torch.float32, device=device) * 0.5
        expected = t.double().sum().item()
        handle = cartage.hold(export(t))
        del t
        gc.collect()
        # Fresh tensors of the same size would take the memory if it had been freed.
        junk = [torch.full((1 << 16,), -1.0, device=device) for _ in range(8)]
        total = cartage.held_sum(handle)
        del junk
        cartage.release(handle)
        assert total == expected, (total, expected)

    case(f"torch {device} memory stays valid while cartage holds it", kept_alive_by_cartage)

    def back_outlives_the_original():
        t = torch.randn(256, 3, device=device)
        expected = t.clone()
        back, _ = cartage.roundtrip(export(t))
        back = torch.from_dlpack(back)
        del t
        gc.collect()
        junk = [torch.zeros(256, 3, device=device) for _ in range(8)]
        assert torch.equal(back, expected)
        del junk

    case(f"torch {device} the round-tripped tensor outlives the original", back_outlives_the_original)

    def refused():
        t = torch.zeros(4, dtype=torch.complex64, device=device)
        try:
            cartage.roundtrip(export(t))
        except RuntimeError as e:
            assert "complex" in str(e), e
        else:
            raise AssertionError("a complex tensor was imported")

    case(f"torch {device} a complex tensor is refused", refused)

    def unconsumed():
        before = unconsumed_deleted
        capsule, _ = cartage.roundtrip(export(torch.ones(8, device=device)))
        del capsule
        gc.collect()
        assert unconsumed_deleted == before + 1

    case(f"torch {device} an unconsumed capsule calls the deleter", unconsumed)


class Exported:
    """An object speaking the Python DLPack protocol for numpy's `from_dlpack`."""

    def __init__(self, capsule, device):
        self.capsule, self.device = capsule, device

    def __dlpack__(self, *args, **kwargs):
        return self.capsule

    def __dlpack_device__(self):
        return self.device


def numpy_cases(cartage, np):
    def round_trip():
        for dtype in [np.float32, np.float64, np.int64, np.int32, np.uint8, np.float16, np.bool_]:
            a = (np.arange(24).reshape(4, 6) % 5).astype(dtype)
            view = a[1:, ::2]
            back_capsule, total = cartage.roundtrip(view.__dlpack__())
            back = np.from_dlpack(Exported(back_capsule, (1, 0)))
            assert back.__array_interface__["data"][0] == view.__array_interface__["data"][0], dtype
            assert back.strides == view.strides and back.dtype == view.dtype, (back.strides, view.strides)
            assert np.array_equal(back, view), dtype
            assert total == float(view.astype(np.float64).sum()), (total, dtype)

    case("numpy cpu round trip (views, every dtype)", round_trip)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", required=True, help="path of libdlpack_ffi.so")
    parser.add_argument("--device", default="all", choices=["cpu", "cuda", "all"])
    parser.add_argument("--require-cuda", action="store_true", help="fail instead of skipping without CUDA")
    args = parser.parse_args()
    cartage = Cartage(args.lib)
    try:
        import torch
    except ImportError:
        torch = None
        print("SKIP torch cases: torch is not installed")
    try:
        import numpy as np
    except ImportError:
        np = None
        print("SKIP numpy cases: numpy is not installed")
    if torch is not None:
        if args.device in ("cpu", "all"):
            torch_cases(cartage, torch, "cpu")
        if args.device in ("cuda", "all"):
            if torch.cuda.is_available():
                torch_cases(cartage, torch, "cuda:0")
            elif args.require_cuda:
                results.append(("torch cuda", RuntimeError("--require-cuda but torch sees no CUDA device")))
                print("FAIL torch cuda: torch sees no CUDA device")
            else:
                print("SKIP torch cuda cases: torch sees no CUDA device")
    if np is not None and args.device in ("cpu", "all"):
        numpy_cases(cartage, np)
    failed = sum(1 for _, e in results if e is not None)
    print(f"{len(results) - failed} passed, {failed} failed")
    sys.exit(1 if failed or not results else 0)


if __name__ == "__main__":
    main()
