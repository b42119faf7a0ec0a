#!/usr/bin/env python3
"""Slims the RAPIDS Accelerator's jar for a GPU host that runs one Spark version on Hopper GPUs.

    slim_rapids_jar.py IN.jar OUT.jar SHIM ARCH      e.g. ... spark413 90

The distribution jar carries one folder of classes per supported Spark version ("shims": spark350,
..., spark413, ...) and libcudf.so with GPU code for every architecture from sm_75 to sm_120; the
GPU host needs one shim and one architecture. Kept: every entry outside the shim folders, the
SHIM folder, and libcudf.so with only its sm_ARCH cubins (no PTX) and without its static symbol
table (strip --strip-unneeded; the dynamic symbols stay). Entries are stored uncompressed so that
an archiver that follows (xz) sees the bytes themselves.

The cubins sit in the .nv_fatbin section as a sequence of fat binaries, each a 16-byte header
(magic 0xBA55ED50, version, header size, payload size) followed by entries (a 64-byte-or-longer
header: kind 1 PTX / 2 ELF, header size, payload size, and the architecture at byte 28). Each fat
binary keeps its start (the registration wrappers in .nvFatBinSegment point there), its header
says only the kept entries, and the bytes after them become zeros. The runtime then finds exactly
one cubin per fat binary, for ARCH.
"""
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile

MAGIC = 0xBA55ED50
LIBCUDF = "amd64/Linux/libcudf.so"


def fatbins(data):
    p = 0
    while p + 16 <= len(data):
        magic, _, hs, fs = struct.unpack_from("<IHHQ", data, p)
        if magic != MAGIC:
            q = data.find(struct.pack("<I", MAGIC), p)
            if q < 0:
                return
            p = q
            continue
        entries, e = [], p + hs
        while e < p + hs + fs:
            kind, _, ehs, psize = struct.unpack_from("<HHIQ", data, e)
            arch, = struct.unpack_from("<I", data, e + 28)
            entries.append((e, kind, arch, ehs + psize))
            e += ehs + psize
        yield p, hs, entries
        p += hs + fs


def keep_arch(path, arch):
    sections = subprocess.run(["readelf", "-S", "-W", path], capture_output=True, text=True, check=True).stdout
    m = re.search(r"\.nv_fatbin\s+PROGBITS\s+\S+\s+(\S+)\s+(\S+)", sections)
    if not m:
        raise SystemExit(path + " has no .nv_fatbin section")
    off, size = int(m.group(1), 16), int(m.group(2), 16)
    with open(path, "r+b") as f:
        f.seek(off)
        data = f.read(size)
        out = bytearray(size)
        kept = count = 0
        for p, hs, entries in fatbins(data):
            body = b"".join(data[e:e + n] for e, kind, a, n in entries if kind == 2 and a == arch)
            if not body:
                raise SystemExit("a fat binary at +%d has no sm_%d cubin; kept as it is would be safer" % (p, arch))
            header = bytearray(data[p:p + hs])
            struct.pack_into("<Q", header, 8, len(body))
            out[p:p + hs] = header
            out[p + hs:p + hs + len(body)] = body
            kept += len(body)
            count += 1
        f.seek(off)
        f.write(out)
    print("libcudf.so: %d fat binaries, %d MiB of sm_%d cubins kept of %d MiB" % (count, kept >> 20, arch, size >> 20))


def main():
    src, dst, shim, arch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    shim_dir = re.compile(r"^spark\d+[a-z0-9]*/")
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(src) as zin, \
            zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        if not any(n.startswith(shim + "/") for n in zin.namelist()):
            shims = sorted({n.split("/")[0] for n in zin.namelist() if shim_dir.match(n)})
            raise SystemExit("%s has no %s folder; its shims: %s" % (src, shim, " ".join(shims)))
        for info in zin.infolist():
            name = info.filename
            if shim_dir.match(name) and not name.startswith(shim + "/"):
                continue
            if name.startswith("spark-shared/libs/") and ("macos" in name or "arm64" in name):
                continue
            if name == LIBCUDF:
                lib = tmp + "/libcudf.so"
                with zin.open(info) as i, open(lib, "wb") as o:
                    shutil.copyfileobj(i, o, 1 << 24)
                keep_arch(lib, arch)
                subprocess.run(["strip", "--strip-unneeded", lib], check=True)
                info.compress_type = zipfile.ZIP_STORED
                with open(lib, "rb") as i, zout.open(info, "w", force_zip64=True) as o:
                    shutil.copyfileobj(i, o, 1 << 24)
                continue
            data = zin.read(info)
            info.compress_type = zipfile.ZIP_STORED
            zout.writestr(info, data)


if __name__ == "__main__":
    main()
