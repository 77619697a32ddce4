"""On a GPU machine with torch: a CUDA plan fed torch CUDA tensors returns DeviceArrays
equal to the host path's outputs, through both device protocols:

- ``__cuda_array_interface__`` only (the tensors wrapped so that DLPack is hidden);
- DLPack (the tensors as they are: the runtime prefers DLPack), once more with the
  tensors written on a side stream just before the run (the producer must order that
  work before the session's stream);

and the outputs are read back with ``torch.as_tensor`` (``__cuda_array_interface__``) and
``torch.from_dlpack`` (no copy: same address), still valid after the DeviceArray is dropped.
Prints one line per check and "device feeds ok" or "device feeds FAILED" (exit 1).

    PYTHONPATH=. python tools/device_feeds_check.py build/gpu/bert-float16.tfplan build/gpu/bert-float16.npz
"""
import gc
import sys

import numpy as np
import torch

from models.reference import load_reference
from tilefuse.runtime import DeviceArray, InferenceSession


class OnlyCudaArrayInterface:
    """A torch CUDA tensor showing only ``__cuda_array_interface__``."""

    def __init__(self, tensor):
        self.tensor = tensor
        self.__cuda_array_interface__ = tensor.__cuda_array_interface__


def main(plan: str, npz: str) -> int:
    feeds, _ = load_reference(npz)
    sess = InferenceSession(plan)
    names = [o.name for o in sess.get_outputs()]
    host = sess.run(None, feeds)
    failures = []

    def check(label, outputs, read):
        for name, h in zip(names, host):
            d = outputs.pop(0)  # ours is then the only reference
            if not isinstance(d, DeviceArray):
                failures.append(f"{label} {name}: got {type(d).__name__}, not a DeviceArray")
                continue
            t = read(d)
            shared = t.data_ptr() == d.ptr
            copied = np.array_equal(d.numpy(), h)
            del d
            gc.collect()  # the tensor must keep the memory it borrowed
            got = t.cpu().numpy()
            ok = t.is_cuda and shared and copied and got.shape == h.shape and np.array_equal(got, h)
            print(f"{label} {name}: {'equals' if ok else 'DIFFERS FROM'} the host path's output"
                  f" ({'same memory' if shared else 'A COPY'}; numpy() {'equal' if copied else 'DIFFERS'})")
            if not ok:
                failures.append(f"{label} {name}")

    def attempt(label, run, read):
        try:
            check(label, run(), read)
        except Exception as e:  # noqa: BLE001 - reported as a failed check
            print(f"{label}: raised {type(e).__name__}: {e}")
            failures.append(label)

    on_gpu = {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}
    attempt("cuda_array_interface in, torch.as_tensor out",
            lambda: sess.run(None, {k: OnlyCudaArrayInterface(v) for k, v in on_gpu.items()}),
            lambda d: torch.as_tensor(d, device="cuda"))
    attempt("dlpack in, torch.from_dlpack out", lambda: sess.run(None, on_gpu), torch.from_dlpack)

    def from_a_side_stream():
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):  # the copies queue behind some long products
            busy = torch.randn(8192, 8192, device="cuda")
            for _ in range(8):
                busy @ busy
            written = {k: torch.empty_like(v).copy_(v) for k, v in on_gpu.items()}
            return sess.run(None, written)

    attempt("dlpack in from a side stream, torch.from_dlpack out", from_a_side_stream, torch.from_dlpack)

    if failures:
        print(f"device feeds FAILED: {len(failures)} mismatch(es): {failures}")
        return 1
    print("device feeds ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
