# bad_modules.py MODULE OUT_DIR: writes the damaged copies of a compiled module that
# test_bad_inputs.sh loads: cuts at several points, corrupted ELF headers, another module
# format version, damaged metadata. Each file name says what was done to it. Standard library only.
import os
import struct
import sys

src, out = sys.argv[1], sys.argv[2]
data = open(src, "rb").read()

def write(name, blob):
    with open(os.path.join(out, name + ".so"), "wb") as f:
        f.write(blob)

def patched(offset, fmt, value):
    b = bytearray(data)
    struct.pack_into(fmt, b, offset, value)
    return bytes(b)

# ELF64 header fields (<elf.h>): e_type @16, e_machine @18, e_phoff @32, e_phentsize @54, e_phnum @56
phoff, = struct.unpack_from("<Q", data, 32)
phnum, = struct.unpack_from("<H", data, 56)
# the first PT_LOAD program header: p_type @0, p_filesz @32, p_memsz @40
load = next(phoff + 56 * i for i in range(phnum) if struct.unpack_from("<I", data, phoff + 56 * i)[0] == 1)
filesz, = struct.unpack_from("<Q", data, load + 32)

# truncated copies: inside the ELF header, the program headers, the first and a middle segment,
# and one byte short (the section headers at the end)
cuts = {"cut_header": 10, "cut_phdrs": phoff + 20, "cut_segment0": 1000, "cut_middle": len(data) // 2,
        "cut_last_byte": len(data) - 1}
for name, cut in cuts.items():
    write(name, data[:cut])
write("class32", patched(4, "B", 1))
write("bigendian", patched(5, "B", 2))
machine, = struct.unpack_from("<H", data, 18)
write("other_machine", patched(18, "<H", 62 if machine == 183 else 183))  # x86-64 <-> AArch64
write("executable", patched(16, "<H", 2))
write("phentsize", patched(54, "<H", 40))
write("no_phdrs", patched(56, "<H", 0))
write("phoff_beyond", patched(32, "<Q", len(data) + 4096))
write("phoff_overflow", patched(32, "<Q", 2**64 - 16))
write("segment_beyond", patched(load + 32, "<Q", len(data) * 4))
write("memsz_small", patched(load + 40, "<Q", filesz - 1))

# the module object (rt_abi.h): magic "XTC1", then the version, both uint32
abi = data.find(b"XTC1" + struct.pack("<I", 1))
assert abi >= 0, "no xtc_module_v1 object found"
write("abi_version2", patched(abi + 4, "<I", 2))
write("bad_magic", patched(abi, "<I", 0x32435458))
# the metadata text: its header line, a record, its end
meta = data.find(b"xtc-module 1\n")
assert meta >= 0, "no metadata found"
write("meta_version2", patched(meta + 11, "B", ord("2")))
end = data.index(b"\nend\n", meta)
write("meta_no_end", patched(end + 1, "B", 0))  # the text stops before its "end"
sym = data.index(b"\nsym ", meta)
write("meta_bad_sym", patched(sym + 1, "3s", b"syn"))
