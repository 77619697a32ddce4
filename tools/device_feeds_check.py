"""On a GPU machine with torch: a CUDA plan fed torch CUDA tensors returns DeviceArrays
equal to the host path's outputs.

    PYTHONPATH=. python tools/device_feeds_check.py build/gpu/bert-float16.tfplan build/gpu/bert-float16.npz
"""
import sys

import numpy as np
import torch

from models.reference import load_reference
from tilefuse.runtime import DeviceArray, InferenceSession

plan, npz = sys.argv[1], sys.argv[2]
feeds, _ = load_reference(npz)
sess = InferenceSession(plan)
host = sess.run(None, feeds)
device = sess.run(None, {k: torch.from_numpy(v).cuda() for k, v in feeds.items()})
for name, h, d in zip([o.name for o in sess.get_outputs()], host, device):
    assert isinstance(d, DeviceArray), type(d)
    t = torch.as_tensor(d, device="cuda")
    assert t.is_cuda and tuple(t.shape) == h.shape
    assert np.array_equal(t.cpu().numpy(), h) and np.array_equal(d.numpy(), h)
    print(f"{name}: {d} equals the host path's output")
print("device feeds ok")
