"""Launching a bundle kernel through the CUDA driver with ctypes (libcuda.so.1; no other package).

A `Kernel` loads one manifest entry's cubin into the current context (the one PyTorch made current
for its device) and launches it on a stream handle, e.g. `torch.cuda.current_stream().cuda_stream`:
a launch made while that stream is being captured becomes a node of the CUDA graph, so replaying
the graph replays our kernel with the rest of the model. Tensor maps (TMA) are encoded on the host
for the buffers of each launch, as the manifest's recipes say (`bundle/c/tensortune_bundle.h` does
the same in C).
"""

import ctypes
import os

_lib = None

# CUtensorMapDataType, CUtensorMapSwizzle, CUtensorMapL2promotion and the attribute used below.
_MAP_TYPE = {"f16": 6, "bf16": 9, "f32": 7, "tf32": 7, "i32": 3, "i8": 0}
_SWIZZLE_128B = 3
_L2_256B = 3
_ATTR_MAX_DYNAMIC_SMEM = 8
_STATIC_SMEM_LIMIT = 48 * 1024


class CudaError(RuntimeError):
    """A driver call failed; the message names the call and the kernel."""


def lib():
    """libcuda, loaded once."""
    global _lib
    if _lib is None:
        try:
            _lib = ctypes.CDLL(os.environ.get("TENSORTUNE_LIBCUDA", "libcuda.so.1"))
        except OSError as e:
            raise CudaError(f"cannot load the CUDA driver (libcuda.so.1): {e}") from None
    return _lib


def _check(result, call, what):
    if result != 0:
        name = ctypes.c_char_p()
        lib().cuGetErrorName(result, ctypes.byref(name))
        raise CudaError(f"{call} failed with {name.value.decode() if name.value else result} ({what})")


def _aligned_map():
    # A CUtensorMap: 128 bytes, 64-byte aligned (ctypes buffers align to 16).
    raw = ctypes.create_string_buffer(128 + 64)
    offset = (-ctypes.addressof(raw)) % 64
    return raw, ctypes.addressof(raw) + offset


def _u64s(values):
    return (ctypes.c_uint64 * len(values))(*values)


def _u32s(values):
    return (ctypes.c_uint32 * len(values))(*values)


def _encode(call, recipe, address, rank, middle):
    """Encodes a CUtensorMap with `call` (the tiled or im2col encoder): the arguments both share
    around `middle`, those of its own; (keep-alive, pointer)."""
    raw, at = _aligned_map()
    r = getattr(lib(), call)(
        ctypes.c_void_p(at),
        ctypes.c_int(_MAP_TYPE[recipe["dtype"]]),
        ctypes.c_uint32(rank),
        ctypes.c_void_p(address),
        _u64s(recipe["dims"]),
        _u64s(recipe["strides_bytes"]),
        *middle,
        ctypes.c_int(0),  # no interleave
        ctypes.c_int(_SWIZZLE_128B),
        ctypes.c_int(_L2_256B),
        ctypes.c_int(0),  # out-of-bounds elements read as zero
    )
    _check(r, call, f"operand {recipe['operand']}")
    return raw, at


def encode_tiled(recipe, address):
    """A tiled CUtensorMap over `address`, as a manifest `tensor_map` param says."""
    return _encode("cuTensorMapEncodeTiled", recipe, address, 2, [_u32s(recipe["box_dims"]), _u32s(recipe["element_strides"])])


def encode_im2col(recipe, address):
    """An im2col CUtensorMap over a convolution's NHWC input."""
    middle = [
        (ctypes.c_int * 2)(*recipe["lower_corner"]),
        (ctypes.c_int * 2)(*recipe["upper_corner"]),
        ctypes.c_uint32(recipe["channels_per_pixel"]),
        ctypes.c_uint32(recipe["pixels_per_column"]),
        _u32s(recipe["element_strides"]),
    ]
    return _encode("cuTensorMapEncodeIm2col", recipe, address, 4, middle)


class Kernel:
    """One bundle entry loaded into the current CUDA context."""

    def __init__(self, entry, cubin_path):
        self.entry = entry
        self.name = entry["name"]
        with open(cubin_path, "rb") as f:
            self._image = f.read()
        d = lib()
        self._module = ctypes.c_void_p()
        _check(d.cuModuleLoadData(ctypes.byref(self._module), self._image), "cuModuleLoadData", self.name)
        self._function = ctypes.c_void_p()
        _check(
            d.cuModuleGetFunction(ctypes.byref(self._function), self._module, entry["entry"].encode()),
            "cuModuleGetFunction",
            self.name,
        )
        launch = entry["launch"]
        self._grid = launch["grid"]
        self._block = launch["block"]
        self._smem = launch["dynamic_smem_bytes"]
        if self._smem > _STATIC_SMEM_LIMIT:
            _check(
                d.cuFuncSetAttribute(self._function, ctypes.c_int(_ATTR_MAX_DYNAMIC_SMEM), ctypes.c_int(self._smem)),
                "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
                self.name,
            )

    def launch(self, pointers, stream):
        """Launches on `stream` (a CUstream handle as int) with `pointers`: operand name (a, b, c,
        d, workspace) -> device address."""
        keep = []
        values = []
        for p in self.entry["params"]:
            kind = p["kind"]
            if kind == "pointer":
                v = ctypes.c_void_p(pointers[p["operand"]])
                keep.append(v)
                values.append(ctypes.addressof(v))
            elif kind == "tensor_map":
                raw, at = encode_tiled(p, pointers[p["operand"]])
                keep.append(raw)
                values.append(at)
            elif kind == "im2col_map":
                raw, at = encode_im2col(p, pointers[p["operand"]])
                keep.append(raw)
                values.append(at)
            else:
                raise CudaError(f"kernel {self.name}: parameter kind {kind!r} is not known to this loader")
        args = (ctypes.c_void_p * len(values))(*values)
        g, b = self._grid, self._block
        r = lib().cuLaunchKernel(
            self._function,
            ctypes.c_uint(g[0]),
            ctypes.c_uint(g[1]),
            ctypes.c_uint(g[2]),
            ctypes.c_uint(b[0]),
            ctypes.c_uint(b[1]),
            ctypes.c_uint(b[2]),
            ctypes.c_uint(self._smem),
            ctypes.c_void_p(stream),
            args,
            None,
        )
        _check(r, "cuLaunchKernel", self.name)
