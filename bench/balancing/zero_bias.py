#!/usr/bin/env python3
"""Sets every MoE selection bias (layers.L.moe.router.bias) of a native checkpoint to zero.

The file is changed in place.

The synthetic weights draw the bias from N(0, 0.1) so that an untrained model exercises it; a
training run starts it at zero (as DeepSeek-V3 does), or the runs without quantile balancing would
keep a random selection skew that they cannot move.
usage: zero_bias.py MODEL.safetensors
"""
import json
import struct
import sys

path = sys.argv[1]
with open(path, "r+b") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
    zeroed = 0
    for name, t in header.items():
        if name.endswith(".moe.router.bias"):
            if t["dtype"] != "F32":
                sys.exit(f"zero_bias.py: {name} is {t['dtype']}, expected F32")
            begin, end = t["data_offsets"]
            f.seek(8 + n + begin)
            f.write(bytes(end - begin))
            zeroed += 1
if zeroed == 0:
    sys.exit(f"zero_bias.py: no MoE selection bias in {path}")
print(f"zeroed {zeroed} selection biases in {path}")
