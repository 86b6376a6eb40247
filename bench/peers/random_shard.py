#!/usr/bin/env python3
"""Writes a Loom token shard (trainer/token_shard.h: "LOOMTOKS", version 1) of uniformly random
token ids in [0, vocab), one document, for the speed comparison in bench/peers (README.md): both
loom-trainer (data.task "shards") and fla_train.py (--shard) draw their B x T windows from it, so
the two sides train on the same data. Standard library only.

  python3 bench/peers/random_shard.py --out FILE --vocab V [--tokens N] [--seed S]
"""
import argparse
import array
import random
import struct
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--tokens", type=int, default=1 << 22)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.vocab < 1 or a.vocab > 1 << 31 or a.tokens < 1:
        ap.error("--vocab must be in [1, 2^31] and --tokens >= 1")
    width = 2 if a.vocab <= 65536 else 4  # the shard's token width: u16 when every id fits
    rng = random.Random(a.seed)
    toks = array.array("H" if width == 2 else "I", (rng.randrange(a.vocab) for _ in range(a.tokens)))
    if sys.byteorder != "little":
        toks.byteswap()
    with open(a.out, "wb") as f:
        f.write(b"LOOMTOKS" + struct.pack("<IIQQ", 1, width, 1, a.tokens))
        f.write(struct.pack("<QQ", 0, a.tokens))  # doc_offsets: one document
        f.write(toks.tobytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
