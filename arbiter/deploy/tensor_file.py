"""A safetensors file held in one uint8 tensor, read as views of it: no copy.

``safetensors.torch.load(bytes)`` copies every tensor out of the bytes it is given, and
the library has no zero-copy reader of a buffer (``safe_open`` maps a file of its own:
a saved program's weights are a member of its zip archive). On a load that is a second
pass over every weight and the weights held twice until it ends (DistilBERT: 0.15 s of
its 1.2 s load, 267 MB more at its peak). The format is small and fixed (safetensors'
README: an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
shape and byte range in the data after it), so the reader is here: every field checked,
ranges inside the data and not overlapping, a clear error naming the file otherwise. A
tensor whose start is not a multiple of its element size (safetensors' writer aligns
them; another writer may not) is copied."""
from __future__ import annotations

import json

import torch

from ..errors import ArbiterError

#: the header is JSON of at most this many bytes (safetensors' own limit)
MAX_HEADER = 100 * 1024 * 1024
DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
    "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
    "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
    **({"F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
       if hasattr(torch, "float8_e5m2") else {}),
}


def tensors(buf: torch.Tensor, where: str) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file in ``buf`` (uint8, 1-D), views of it; an
    ``ArbiterError`` naming ``where`` for anything malformed."""
    def bad(why: str) -> ArbiterError:
        return ArbiterError(f"{where}: cannot be read as safetensors ({why})")

    total = buf.numel()
    if total < 8:
        raise bad(f"{total} bytes, shorter than the header's length")
    n = int.from_bytes(buf[:8].numpy().tobytes(), "little")
    if n > min(MAX_HEADER, total - 8):
        raise bad(f"the header says it is {n} bytes long, the file has {total - 8} after it")
    try:
        header = json.loads(buf[8:8 + n].numpy().tobytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad(f"the header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise bad("the header is not an object")
    start = 8 + n
    size = total - start
    out: dict[str, torch.Tensor] = {}
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict):
            raise bad(f"tensor {name!r}: not an object")
        dtype = DTYPES.get(info.get("dtype"))
        shape, span = info.get("shape"), info.get("data_offsets")
        if dtype is None:
            raise bad(f"tensor {name!r}: dtype {info.get('dtype')!r} is not one of "
                      f"{', '.join(DTYPES)}")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise bad(f"tensor {name!r}: shape {shape!r} is not a list of sizes")
        if not (isinstance(span, list) and len(span) == 2 and
                all(type(x) is int for x in span) and 0 <= span[0] <= span[1] <= size):
            raise bad(f"tensor {name!r}: data_offsets {span!r} are not inside the "
                      f"{size} bytes of data")
        numel = 1
        for d in shape:
            numel *= d
        item = dtype.itemsize
        if span[1] - span[0] != numel * item:
            raise bad(f"tensor {name!r}: {span[1] - span[0]} bytes for shape {shape} of "
                      f"{info['dtype']}")
        begin = start + span[0]
        raw = buf[begin:begin + numel * item]
        if begin % item:  # not aligned for a view of this dtype: copied
            raw = raw.clone()
        out[name] = raw.view(dtype).reshape(shape)
        spans.append((span[0], span[1], name))
    spans.sort()
    for (_, end, a), (begin, _, b) in zip(spans, spans[1:]):
        if begin < end:
            raise bad(f"tensors {a!r} and {b!r} overlap")
    return out
