"""One packed real-size plan, each kernel launched once on its own: the program to put
under Nsight Compute on the GPU machine.

    ncu --clock-control none --kernel-name regex:'reduce_sum|matmul' --launch-count 6 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        python benchmarks/gpu_profile.py build/gpu_real/bert-float16-b32.tfplan

The plan comes from ``gpu_peers.py pack`` (no weights: they are synthesised as there).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    from gpu_peers import prepare

    sess, feeds = prepare(Path(sys.argv[1]))
    sess.run(None, feeds)
    for kernel, ms in sess._executor.timed_steps(1):
        print(f"{kernel:44s} {1e3 * ms:8.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
