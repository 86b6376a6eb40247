#!/usr/bin/env python3
"""Tests of plot_loss.py: the windowed means and thresholds of a hand-made run (worked out by hand
below), a PNG written, and exit status 2 for a file without step lines."""

import io
import json
import os
import shutil
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plot_loss  # noqa: E402


class PlotLossTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="plot_loss_test_")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def write(self, name, losses):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(json.dumps({"checkpoint": "ignored"}) + "\n")
            for i, l in enumerate(losses, start=1):
                f.write(json.dumps({"step": i, "loss": l, "tokens": 64}) + "\n")
        return path

    def test_windows_and_thresholds(self):
        # Windows of 2: (4 + 2) / 2 = 3 at step 2, (0.8 + 0.2) / 2 = 0.5 at step 4 (not below
        # 0.5), (0.06 + 0.02) / 2 = 0.04 at step 6, 0.01 at step 7 (a window of one).
        points = plot_loss.read_losses(self.write("a.jsonl", [4, 2, 0.8, 0.2, 0.06, 0.02, 0.01]))
        curve = plot_loss.windowed(points, 2)
        self.assertEqual([s for s, _ in curve], [2, 4, 6, 7])
        for got, want in zip([l for _, l in curve], [3.0, 0.5, 0.04, 0.01]):
            self.assertAlmostEqual(got, want)
        s = plot_loss.summarise("a", points, 2)
        self.assertEqual(s["first_step_below_0.5"], 6)
        self.assertEqual(s["first_step_below_0.05"], 6)
        self.assertAlmostEqual(s["first_window_loss"], 3.0)
        self.assertAlmostEqual(s["last_window_loss"], 0.01)

    @unittest.skipIf(shutil.which("gnuplot") is None, "gnuplot is not installed")
    def test_png(self):
        a = self.write("a.jsonl", [5, 4, 3, 1, 0.1, 0.01])
        b = self.write("b.jsonl", [5, 5, 5, 4.9])
        out = os.path.join(self.tmp, "c.png")
        buf = io.StringIO()
        with redirect_stdout(buf):
            rc = plot_loss.main(["--out", out, "--window", "2", "--hline", "4.85:chance",
                                 "A=" + a, "B=" + b])
        self.assertEqual(rc, 0)
        with open(out, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        lines = [json.loads(l) for l in buf.getvalue().splitlines()]
        self.assertEqual([l["run"] for l in lines], ["A", "B"])
        self.assertIsNone(lines[1]["first_step_below_0.5"])

    def test_no_steps(self):
        path = os.path.join(self.tmp, "empty.jsonl")
        with open(path, "w") as f:
            f.write(json.dumps({"checkpoint": "x"}) + "\n")
        self.assertEqual(plot_loss.main(["--out", os.path.join(self.tmp, "x.png"), "E=" + path]),
                         2)


if __name__ == "__main__":
    unittest.main()
