#!/usr/bin/python3
"""Writes dra_resource_slices.json beside this file: ResourceSlices in the
shapes of tests/fakes/fake_dra_driver.py (NVIDIA's and Google's TPU driver),
for the node inventory's DRA-pool tests (tests/k8s_adapter/reconcile).

  nvidia    node dra-gpu-1: 8 whole GPUs gpu-0..gpu-7
  nvidia_mig_vfio
            node dra-gpu-2: 2 GPUs, each with two MIG devices and a
            gpu-vfio-<i> sibling (only gpu-0 and gpu-1 are whole GPUs)
  tpu       node dra-tpu-1: 4 chips accel0..accel3 (one shared uuid)

Run: python3 tests/k8s_adapter/testdata/make_dra_slices.py
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "fakes"))

import fake_dra_driver as drv  # noqa: E402


def main():
    out = {
        "nvidia": drv.resource_slice("nvidia", "dra-gpu-1", drv.nvidia_devices("dra-gpu-1", 8)),
        "nvidia_mig_vfio": drv.resource_slice(
            "nvidia", "dra-gpu-2", drv.nvidia_devices("dra-gpu-2", 2, mig=True, vfio=True)),
        "tpu": drv.resource_slice("tpu", "dra-tpu-1", drv.tpu_devices("dra-tpu-1", 4)),
    }
    with open(os.path.join(HERE, "dra_resource_slices.json"), "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
