#!/usr/bin/env python3
# fuzz/make_corpus.py: writes the seed corpora of the fuzz targets into fuzz/corpus/<target>/
# (small valid files and a few edge cases each; the files are in the repository, this script
# is how they were made). Standard library only. Usage: python3 fuzz/make_corpus.py
import gzip
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def gz(data):
    return gzip.compress(data, mtime=0)


def split2(a, b):
    """The two-file layout of fuzz_util.h: u32 length of 'a', then 'a', then 'b'."""
    return struct.pack("<I", len(a)) + a + b


# ---- safetensors and checkpoints ---------------------------------------------------------
def safetensors(tensors, meta=None, pad=8):
    """tensors: [(name, dtype, shape, bytes)]."""
    header, off, data = {}, 0, b""
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        data += raw
    if meta is not None:
        header["__metadata__"] = meta
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % pad)
    return struct.pack("<Q", len(h)) + h + data


f32 = lambda *v: struct.pack("<%df" % len(v), *v)
ckpt_vars = [
    ("fc1.weight", "F32", [2, 3], f32(1, 2, 3, 4, 5, 6)),
    ("fc1.bias", "F32", [3], f32(0.5, -1, 2)),
    ("step", "I64", [], struct.pack("<q", 42)),
    ("mask", "BOOL", [4], bytes([1, 0, 1, 1])),
    ("half", "F16", [2], struct.pack("<2H", 0x3C00, 0xC000)),
]
for t in ("safetensors", "checkpoint"):
    put(t, "all_vars", safetensors(ckpt_vars, {"format": "pt", "step": "42"}))
    put(t, "empty", safetensors([]))
    put(t, "partial", safetensors(ckpt_vars[:2]))
    put(t, "unexpected", safetensors(ckpt_vars + [("extra", "I32", [2, 0], b"")]))
    put(t, "wrong_shape", safetensors([("fc1.weight", "F32", [3, 2], f32(*range(6)))]))
    put(t, "bad_bool", safetensors([("mask", "BOOL", [4], bytes([1, 2, 0, 1]))]))
    put(t, "dtypes", safetensors([
        ("a", "F64", [1], struct.pack("<d", 1.5)), ("b", "I32", [2], struct.pack("<2i", 1, -1)),
        ("c", "U8", [3], b"abc"), ("d", "BF16", [1], b"\x80\x3f"),
        ("e", "I8", [1], b"\x01")]))
    put(t, "truncated", safetensors(ckpt_vars)[:-5])
    put(t, "huge_len", struct.pack("<Q", 1 << 62) + b"{}")
# last byte selects the ALLOW_ flags in fuzz_checkpoint.c: a file ending in 0x03 allows both
put("checkpoint", "all_vars_allow", safetensors(ckpt_vars, pad=8) + b"\x03")
# bit 2 of the last byte: wf_checkpoint_restore (a checkpointer's file, with "weft.step" and
# extras such as weft-train's options text and data position)
ckptr_meta = {"format": "pt", "weft": "0.1.0", "weft.step": "100"}
ckptr_extra = [("weft-train.options", "U8", [11], b"--batch 32\n"),
               ("weft-train.position", "I64", [4], struct.pack("<4q", 100, 45, 1438, 32))]
put("checkpoint", "restore_ok", safetensors(ckpt_vars + ckptr_extra, ckptr_meta) + b"\x04")
put("checkpoint", "restore_no_extras", safetensors(ckpt_vars, ckptr_meta) + b"\x04")
for name, step in (("leading_zero", "0100"), ("negative", "-1"), ("letters", "1e3"),
                   ("too_long", "1" * 19), ("empty", "")):
    put("checkpoint", "restore_step_" + name,
        safetensors(ckpt_vars, dict(ckptr_meta, **{"weft.step": step})) + b"\x04")
put("checkpoint", "restore_no_step", safetensors(ckpt_vars, {"format": "pt"}) + b"\x04")

# ---- control frames ------------------------------------------------------------------------
MAGIC = 0x57465446


def frame(ftype, payload):
    return struct.pack("<IHHI", MAGIC, 1, ftype, len(payload)) + payload


def s16(b):
    return struct.pack("<H", len(b)) + b


def hello(rank, size, token=b"secret", host=b"node1", addr=b"\x01\x02\x03\x04"):
    return frame(1, struct.pack("<4I", rank, size, 7, 1234) + s16(token) + s16(host)
                 + struct.pack("<I", len(addr)) + addr)


put("frame", "hello", hello(1, 4))
put("frame", "hello_bad_token", hello(1, 4, token=b"wrong"))
put("frame", "hello_bad_rank", hello(9, 4))
put("frame", "hello_empty_addr", hello(2, 4, addr=b""))
put("frame", "hello_then_barrier", hello(3, 4) + frame(4, struct.pack("<I", 1)))
put("frame", "heartbeat_bye", frame(6, b"") + frame(7, b""))
put("frame", "fail", frame(8, struct.pack("<Ii", 2, -5) + s16(b"rank 2 died")))
put("frame", "release", frame(5, struct.pack("<I", 3)))
put("frame", "bad_magic", b"GET / HTTP/1.1\r\n\r\n")
put("frame", "oversized", struct.pack("<IHHI", MAGIC, 1, 1, 0xFFFFFFFF))

# ---- weft-train: CSV, gzip, IDX, NPY -----------------------------------------------------
csv = b"f1,f2,f3,label\n0.5,1,2,0\n3,-4.25,1e3,1\n\n7,8,9,2\n"
put("csv", "header", csv)
put("csv", "no_header", b"1,2,0\n3,4,1\n")
put("csv", "crlf", b"1,2,0\r\n3,4,1\r\n")
put("csv", "bad_number", b"1,x,0\n")
put("csv", "ragged", b"1,2,0\n3,1\n")
put("csv", "big_label", b"1,2,99999999999\n")
put("csv", "nan", b"nan,1,0\n")


def idx_images(n, rows, cols):
    return struct.pack(">IIII", 0x803, n, rows, cols) + bytes((i * 37) % 256 for i in range(n * rows * cols))


def idx_labels(n):
    return struct.pack(">II", 0x801, n) + bytes(i % 10 for i in range(n))


put("idx", "valid", split2(idx_images(3, 4, 4), idx_labels(3)))
put("idx", "gzip", split2(gz(idx_images(2, 3, 3)), gz(idx_labels(2))))
put("idx", "count_mismatch", split2(idx_images(3, 2, 2), idx_labels(2)))
put("idx", "short", split2(idx_images(3, 4, 4)[:-1], idx_labels(3)))
put("idx", "zero_rows", split2(idx_images(1, 0, 5), idx_labels(1)))
put("idx", "huge_dims", split2(struct.pack(">IIII", 0x803, 1, 0xFFFFFFFF, 0xFFFFFFFF), idx_labels(1)))


def npy(descr, shape, raw, version=1):
    d = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        descr, "".join("%d," % s for s in shape) if len(shape) == 1 else ", ".join(map(str, shape)))
    d = d.encode()
    hl = 2 if version == 1 else 4
    total = 6 + 2 + hl + len(d) + 1
    d += b" " * (-total % 64) + b"\n"
    head = b"\x93NUMPY" + bytes([version, 0]) + struct.pack("<H" if version == 1 else "<I", len(d))
    return head + d + raw


x = npy("<f4", [3, 2], f32(1, 2, 3, 4, 5, 6))
y4 = npy("<i4", [3], struct.pack("<3i", 0, 1, 2))
y8 = npy("<i8", [3], struct.pack("<3q", 2, 1, 0))
put("npy", "valid_i4", split2(x, y4))
put("npy", "valid_i8_v2", split2(npy("<f4", [3, 1, 2], f32(*range(6)), version=2), y8))
put("npy", "valid_v3", split2(npy("<f4", [3], f32(1, 2, 3), version=3), y4))
put("npy", "gzip", split2(gz(x), gz(y4)))
put("npy", "fortran", split2(x.replace(b"False", b"True "), y4))
put("npy", "bad_descr", split2(x.replace(b"<f4", b">f8"), y4))
put("npy", "short", split2(x[:-2], y4))
put("npy", "neg_label", split2(x, npy("<i4", [3], struct.pack("<3i", 0, -1, 2))))

put("gzip", "csv", gz(csv))
put("gzip", "idx_images", gz(idx_images(2, 2, 2)))
put("gzip", "npy", gz(x))
put("gzip", "two_members", gz(b"1,2,0\n") + gz(b"3,4,1\n"))
put("gzip", "truncated", gz(csv * 4)[:-6])
put("gzip", "bad_crc", gz(csv)[:-8] + b"\0\0\0\0" + gz(csv)[-4:])

# ---- flight records (tools/flight_verdict.c) ---------------------------------------------
def flight(rank, ops, failed="WF_ETIMEDOUT", reason="rank 0: no progress", now=5000000000):
    head = {"flight": 1, "rank": rank, "size": 3, "host": "node1", "pid": 100 + rank,
            "incarnation": 7, "failed": failed, "reason": reason, "now_ns": now,
            "ops": len(ops)}
    lines = [json.dumps(head, separators=(",", ":"))]
    for seq, op, state, tag in ops:
        lines.append(json.dumps({"seq": seq, "op": op, "key": 0, "bytes": 4, "count": 1,
                                 "dtype": "f32", "peer": -1, "state": state,
                                 "t_start_ns": 1000000000, "t_end_ns": 0, "rc": 0,
                                 "tag": tag}, separators=(",", ":")))
    return ("\n".join(lines) + "\n").encode()


put("flight", "waiting", flight(0, [(1, "allreduce", "done", "step 0"),
                                    (2, "allreduce", "waiting", "step 1")]))
put("flight", "p2p_and_escapes", flight(2, [(1, "barrier", "done", "a \"q\" \\ \u0001"),
                                            (1, "recv", "waiting", "x")], failed=None,
                                        reason=""))
put("flight", "truncated", flight(1, [(1, "allreduce", "done", "step 0")])[:-9])
put("flight", "no_header", b'{"seq":1,"op":"allreduce"}\n')
put("flight", "big_numbers", b'{"flight":1,"rank":0,"size":1,"now_ns":99999999999999999999}\n'
    b'{"seq":-1,"op":"allreduce","t_start_ns":18446744073709551615,"state":"waiting"}\n')
