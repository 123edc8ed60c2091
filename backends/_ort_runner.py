"""ONNX Runtime's runner: one session run with IOBinding, no copies in or out.

Inputs are bound by pointer and outputs written into tensors torch allocated (the ONNX
Runtime backend's compiled callable; backends/onnxruntime.py).
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

from ._export import Runner

log = logging.getLogger("arbiter.backends.onnxruntime")  # the backend's own log

#: torch dtype -> the numpy type name ONNX Runtime binds
NP_NAMES = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
    torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8",
    torch.uint8: "uint8", torch.bool: "bool",
}


class OrtRunner(Runner):
    """Runs one session with IOBinding: inputs by pointer, outputs into torch tensors.
    Int inputs (a symbolic partition's sizes) are bound as int64 scalars.

    Per call, the binding and the run go straight to ONNX Runtime's C++ objects
    (``IOBinding._iobinding``, ``InferenceSession._sess``) with a CPU device made once:
    the Python wrappers around them rebuild an ``OrtDevice`` per binding and check WebGPU
    graph capture on every run, about 2 us each, more than the run of a small partition
    (bench/README.md, ``per_call_floor.py``). Those wrappers add nothing else for a CPU
    session; where the private objects are missing (another onnxruntime) or graph capture
    is on, the public calls are used."""

    def __init__(self, sess, in_names: list[str], out_names: list[str], example_args: tuple,
                 out_vals: list, in_vals: Optional[list] = None):
        import numpy as np

        if len(in_names) != len(example_args):
            raise RuntimeError(f"exported model has {len(in_names)} inputs, partition has "
                               f"{len(example_args)}")
        super().__init__(out_vals, NP_NAMES, len(out_names), in_vals)
        self.sess = sess
        self.in_names = in_names
        self.in_types = [np.dtype(NP_NAMES[a.dtype]) if isinstance(a, torch.Tensor)
                         else np.dtype("int64") for a in example_args]
        self.out_names = out_names
        self.out_np = [np.dtype(NP_NAMES[dtype]) for _, dtype in self.out_specs]
        self._c = c_session(sess)  # (C++ session, CPU device) or None: public calls
        # static outputs: (name, shape, dtype, numpy type, has elements), made once
        self._static_outs = None if self.dynamic else [
            (name, shape, dtype, np_type, all(s != 0 for s in shape))
            for name, (shape, dtype), np_type in zip(out_names, self.out_specs, self.out_np)]

    def new_handle(self):
        return self.sess.io_binding()

    def __call__(self, *args: torch.Tensor):
        if self._c is not None and self._static_outs is not None:
            return self._call_c(args)
        b = self.handle()
        keep = []  # contiguous copies and int scalars live until the run is done
        for name, t, np_type in zip(self.in_names, args, self.in_types):
            t = self.contiguous(t) if isinstance(t, torch.Tensor) \
                else torch.tensor(t, dtype=torch.int64)
            keep.append(t)
            b.bind_input(name, "cpu", 0, np_type, t.shape, t.data_ptr())
        outs = []
        shapes = self.output_shapes(args)
        for name, shape, (_, dtype), np_type in zip(self.out_names, shapes, self.out_specs,
                                                    self.out_np):
            if shape is None:  # a size that depends on data: ONNX Runtime allocates it
                b.bind_output(name, "cpu")
                outs.append(None)
                continue
            o = torch.empty(shape, dtype=dtype)
            if o.numel():
                b.bind_output(name, "cpu", 0, np_type, shape, o.data_ptr())
            else:  # nothing to write, and IOBinding refuses a zero-size tensor's null pointer
                b.bind_output(name, "cpu")
            outs.append(o)
        self.sess.run_with_iobinding(b)
        if any(o is None for o in outs):
            got = b.get_outputs()
            outs = [torch.from_numpy(got[k].numpy()) if o is None else o
                    for k, o in enumerate(outs)]
        return outs

    def _call_c(self, args) -> list:
        """``__call__`` for static output shapes, on ONNX Runtime's C++ objects (see the
        class): the same bindings, the same checks, fewer Python layers."""
        b = self.handle()._iobinding
        sess, device = self._c
        keep = []  # contiguous copies and int scalars live until the run is done
        for name, t, np_type in zip(self.in_names, args, self.in_types):
            if isinstance(t, torch.Tensor):
                if not t.is_contiguous():
                    t = self.contiguous(t)
            else:
                t = torch.tensor(t, dtype=torch.int64)
            keep.append(t)
            b.bind_input(name, device, np_type, t.shape, t.data_ptr())
        outs = []
        for name, shape, dtype, np_type, filled in self._static_outs:
            o = torch.empty(shape, dtype=dtype)
            if filled:
                b.bind_output(name, device, np_type, shape, o.data_ptr())
            else:  # nothing to write, and IOBinding refuses a zero-size tensor's null pointer
                b.bind_output(name, device)
            outs.append(o)
        sess.run_with_iobinding(b, None)
        return outs


def c_session(sess) -> Optional[tuple]:
    """(the C++ session, a CPU ``OrtDevice``) for ``OrtRunner``'s direct calls, or None
    where this onnxruntime lacks them or the session captures graphs (WebGPU): the public
    wrappers then do their own bookkeeping."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as C
        from onnxruntime.capi.onnxruntime_inference_collection import IOBinding, OrtDevice

        c_sess = sess._sess
        capture = getattr(c_sess, "is_webgpu_graph_capture_enabled", None)
        if capture is not None and capture():
            return None
        if not hasattr(IOBinding(sess), "_iobinding") or \
                any(p != "CPUExecutionProvider" for p in sess.get_providers()):
            return None
        device = OrtDevice.make("cpu", 0)._get_c_device()
        if not isinstance(device, C.OrtDevice) or \
                not callable(getattr(c_sess, "run_with_iobinding", None)):
            return None
        return c_sess, device
    except Exception:  # noqa: BLE001 - any doubt: the public calls
        log.debug("ONNX Runtime's C++ objects are not reachable; public IOBinding calls",
                  exc_info=True)
        return None
