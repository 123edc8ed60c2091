"""arbiter/deploy/tensor_file.py (safetensors read as views of one buffer) and
``Archive.read_buffer`` (a member read into a tensor, hashed chunk by chunk)."""
from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import load, save

from arbiter.deploy import archive
from arbiter.deploy.archive import Archive, write
from arbiter.deploy.tensor_file import tensors
from arbiter.errors import ArbiterError


def _buf(blob: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8)


def _file(header: dict, data: bytes) -> torch.Tensor:
    head = json.dumps(header).encode()
    return _buf(struct.pack("<Q", len(head)) + head + data)


def test_equals_safetensors_and_shares_the_buffer():
    g = torch.Generator().manual_seed(0)
    made = {
        "f32": torch.randn(3, 5, generator=g), "f16": torch.randn(7, generator=g).half(),
        "bf16": torch.randn(2, 3, generator=g).bfloat16(), "f64": torch.randn(4, generator=g).double(),
        "i64": torch.arange(5), "i32": torch.arange(3, dtype=torch.int32),
        "i8": torch.tensor([-3, 4], dtype=torch.int8), "u8": torch.tensor([1, 2, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]), "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
    }
    blob = save(made)
    buf = _buf(blob)
    got = tensors(buf, "w.safetensors")
    ref = load(blob)
    assert got.keys() == ref.keys() == made.keys()
    lo, hi = buf.data_ptr(), buf.data_ptr() + buf.numel()
    for k, t in ref.items():
        assert got[k].dtype == t.dtype and got[k].shape == t.shape and torch.equal(got[k], t), k
        if t.numel():
            assert lo <= got[k].data_ptr() < hi, f"{k} was copied"
    got["f32"][0, 0] = 7.0  # writable: a view of the caller's buffer
    assert tensors(buf, "w")["f32"][0, 0] == 7.0


def test_a_misaligned_tensor_is_copied():
    buf = _file({"b": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                 "f": {"dtype": "F32", "shape": [2], "data_offsets": [1, 9]}},
                b"\x05" + struct.pack("<2f", 1.5, -2.0))
    got = tensors(buf, "w")
    assert got["b"].tolist() == [5]
    assert got["f"].tolist() == [1.5, -2.0]


@pytest.mark.parametrize("header, data, says", [
    (None, b"\x01\x02", "shorter than the header"),
    ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"", "not inside"),
    ({"x": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, "dtype 'Q7'"),
    ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, "4 bytes for shape"),
    ({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, "not a list of sizes"),
    ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
      "y": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}, b"\0" * 8, "overlap"),
    ({"x": [1, 2]}, b"", "not an object"),
])
def test_malformed_files_are_refused_naming_the_file(header, data, says):
    buf = _buf(data) if header is None else _file(header, data)
    with pytest.raises(ArbiterError, match=f"w.safetensors: cannot be read as safetensors.*{says}"):
        tensors(buf, "w.safetensors")


def test_header_length_and_json_are_checked():
    with pytest.raises(ArbiterError, match="header says it is 1000 bytes"):
        tensors(_buf(struct.pack("<Q", 1000) + b"{}"), "w")
    with pytest.raises(ArbiterError, match="header is not JSON"):
        tensors(_buf(struct.pack("<Q", 2) + b"{x"), "w")


def test_read_buffer_equals_read_across_chunks(tmp_path, monkeypatch):
    blob = bytes(range(256)) * 41 + b"tail"
    path = tmp_path / "p.arbiter"
    write(path, {}, {"w.bin": blob, "small": b"ab"})
    monkeypatch.setattr(archive, "CHUNK", 1000)  # ten chunks, the last a short one
    ar = Archive(path)
    try:
        assert bytes(ar.read_buffer("w.bin").numpy()) == ar.read("w.bin") == blob
        assert bytes(ar.read_buffer("small").numpy()) == b"ab"
    finally:
        ar.close()


def test_read_buffer_refuses_what_read_refuses(tmp_path):
    blob = b"x" * 5000
    path = tmp_path / "p.arbiter"
    write(path, {}, {"w.bin": blob})
    raw = path.read_bytes()
    at = raw.index(blob)
    path.write_bytes(raw[:at + 100] + b"y" + raw[at + 101:])  # one byte altered
    ar = Archive(path)
    try:
        with pytest.raises(ArbiterError, match="w.bin does not match its sha256"):
            ar.read_buffer("w.bin")
        with pytest.raises(ArbiterError, match="w.bin does not match its sha256"):
            ar.read("w.bin")
        with pytest.raises(ArbiterError, match="nope is not listed"):
            ar.read_buffer("nope")
    finally:
        ar.close()
