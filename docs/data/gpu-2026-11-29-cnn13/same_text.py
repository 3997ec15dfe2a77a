import ctypes, hashlib, struct, sys
lib = ctypes.CDLL('/work/wt-cnn13/.nvrtc/nvidia/cu13/lib/libnvrtc.so.13')
inc = '/work/wt-cnn13/.nvrtc/nvidia/cu13/include'
def compile(path):
    src = open(path, 'rb').read()
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, b'k.cu', 0, None, None) == 0
    opts = [b'--gpu-architecture=sm_90a', b'-std=c++17', b'--device-as-default-execution-space', ('-I' + inc).encode()]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    r = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t(); lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n)); log = ctypes.create_string_buffer(n.value); lib.nvrtcGetProgramLog(prog, log)
    if r != 0: print(log.value.decode()[:2000]); sys.exit(1)
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(n)); buf = ctypes.create_string_buffer(n.value); lib.nvrtcGetCUBIN(prog, buf)
    return buf.raw
def text(elf):
    u16 = lambda o: struct.unpack_from('<H', elf, o)[0]; u32 = lambda o: struct.unpack_from('<I', elf, o)[0]; u64 = lambda o: struct.unpack_from('<Q', elf, o)[0]
    shoff, shentsize, shnum, shstrndx = u64(0x28), u16(0x3a), u16(0x3c), u16(0x3e)
    strtab = u64(shoff + shstrndx * shentsize + 0x18); out = b''
    for i in range(shnum):
        h = shoff + i * shentsize; na = strtab + u32(h); name = elf[na:elf.index(b'\0', na)]
        if name.startswith(b'.text'): out += elf[u64(h + 0x18):u64(h + 0x18) + u64(h + 0x20)]
    return out
for p in sys.argv[1:]:
    t = text(compile(p)); print(p, len(t), hashlib.sha256(t).hexdigest()[:16])
