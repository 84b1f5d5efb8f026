"""Gorilla-style float and timestamp encoding (Facebook's TSDB paper; Prometheus' chunks): XOR of each
value with the one before, leading/trailing zero counts, and delta-of-delta steps, with a plain bit
writer. Written for the codec comparison of bench/storage_codecs.py (issue 36): faithful and simple,
not fast."""

from __future__ import annotations

import numpy as np


class BitWriter:
    def __init__(self) -> None:
        self.out = bytearray()
        self.acc = 0
        self.n = 0

    def write(self, value: int, nbits: int) -> None:
        self.acc = (self.acc << nbits) | value
        self.n += nbits
        while self.n >= 8:
            self.n -= 8
            self.out.append((self.acc >> self.n) & 0xFF)
        self.acc &= (1 << self.n) - 1

    def bytes(self) -> bytes:
        tail = bytes([(self.acc << (8 - self.n)) & 0xFF]) if self.n else b""
        return bytes(self.out) + tail


class BitReader:
    def __init__(self, data: bytes) -> None:
        self.b = data
        self.pos = 0

    def read(self, nbits: int) -> int:
        p = self.pos
        start, end = p >> 3, (p + nbits + 7) >> 3
        word = int.from_bytes(self.b[start:end], "big")
        self.pos = p + nbits
        return (word >> (end * 8 - p - nbits)) & ((1 << nbits) - 1)


def gorilla_values_enc(a: np.ndarray) -> bytes:
    w = BitWriter()
    words = a.view(np.uint64).tolist()
    prev = words[0]
    w.write(prev, 64)
    lead, trail = 0xFF, 0
    for cur in words[1:]:
        d = cur ^ prev
        prev = cur
        if d == 0:
            w.write(0, 1)
            continue
        lz = min(64 - d.bit_length(), 31)
        tz = (d & -d).bit_length() - 1
        if lead != 0xFF and lz >= lead and tz >= trail:
            w.write(0b10, 2)
            w.write(d >> trail, 64 - lead - trail)
        else:
            lead, trail = lz, tz
            sig = 64 - lz - tz
            w.write(0b11, 2)
            w.write(lz, 5)
            w.write(sig & 63, 6)  # 64 significant bits are written as 0
            w.write(d >> tz, sig)
    return w.bytes()


def gorilla_values_dec(data: bytes, n: int) -> np.ndarray:
    r = BitReader(data)
    prev = r.read(64)
    words = [prev]
    lead = trail = 0
    for _ in range(n - 1):
        if r.read(1):
            if r.read(1):
                lead = r.read(5)
                sig = r.read(6) or 64
                trail = 64 - lead - sig
            prev ^= r.read(64 - lead - trail) << trail
        words.append(prev)
    return np.array(words, dtype=np.uint64).view(np.float64)


def _varint(w: BitWriter, x: int) -> None:
    while True:
        byte, x = x & 0x7F, x >> 7
        w.write(byte | (0x80 if x else 0), 8)
        if not x:
            return


def _read_varint(r: BitReader) -> int:
    x = shift = 0
    while True:
        byte = r.read(8)
        x |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return x


DOD_BUCKETS = ((14, 0b10, 2), (17, 0b110, 3), (20, 0b1110, 4))


def gorilla_steps_enc(a: np.ndarray) -> bytes:
    w = BitWriter()
    s = a.tolist()
    _varint(w, (s[0] << 1) ^ (s[0] >> 63))  # zigzag
    if len(s) > 1:
        _varint(w, s[1] - s[0])
    for i in range(2, len(s)):
        dod = (s[i] - s[i - 1]) - (s[i - 1] - s[i - 2])
        if dod == 0:
            w.write(0, 1)
            continue
        for nbits, tag, taglen in DOD_BUCKETS:
            if -(1 << (nbits - 1)) < dod <= (1 << (nbits - 1)):
                w.write(tag, taglen)
                w.write(dod & ((1 << nbits) - 1), nbits)
                break
        else:
            w.write(0b1111, 4)
            w.write(dod & ((1 << 64) - 1), 64)
    return w.bytes()


def gorilla_steps_dec(data: bytes, n: int) -> np.ndarray:
    r = BitReader(data)
    z = _read_varint(r)
    s = [(z >> 1) ^ -(z & 1)]
    if n > 1:
        s.append(s[0] + _read_varint(r))
    for _ in range(n - 2):
        taglen = 0
        while taglen < 4 and r.read(1):
            taglen += 1
        if taglen == 0:
            dod = 0
        else:
            nbits = (14, 17, 20, 64)[taglen - 1]
            dod = r.read(nbits)
            if dod > (1 << (nbits - 1)):
                dod -= 1 << nbits
        s.append(2 * s[-1] - s[-2] + dod)
    return np.array(s, dtype=np.int64)


# ---------------------------------------------------------------- other codecs
