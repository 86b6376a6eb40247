#!/usr/bin/env python3
"""Tests of plot_rl.py: the summary's numbers on a hand-made run (thirds and medians worked out
by hand below), a PNG for runs with and without a KL term, warm-start lines and routing replay
fields, and exit status 2 for a file without RL step lines."""

import json
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plot_rl  # noqa: E402


def step(i, **kw):
    line = {"step": i, "reward_mean": 0.1 * (i - 1), "reward_std": 0.05, "completion": 0.1 * (i - 1),
            "answered": 0.5, "malformed": 0.0, "response_length": 10.0 * i, "updated": i != 3,
            "loss": 0.01 * i, "entropy": 0.5, "clip_fraction": 0.0, "logprob_mismatch": 1e-6,
            "rollout_tokens_per_s": 100.0 * i, "train_tokens_per_s": 1000.0,
            "weight_sync_s": 0.001 * i if i != 3 else 0.0}
    line.update(kw)
    return line


class PlotRlTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="plot_rl_test_")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def write(self, lines):
        path = os.path.join(self.tmp, "metrics.jsonl")
        with open(path, "w") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
        return path

    def run_tool(self, lines):
        out = os.path.join(self.tmp, "rl.png")
        code = plot_rl.main([self.write(lines), "--out", out, "--title", "t"])
        return code, out

    def test_summary_of_a_hand_made_run(self):
        steps, _ = plot_rl.read_metrics(self.write(
            [{"warm_start_step": 1, "loss": 2.0}] + [step(i) for i in range(1, 7)]))
        s = plot_rl.summarise(steps)
        self.assertEqual(s["steps"], 6)
        # Thirds of 6 steps are 2 steps: rewards 0, 0.1 and 0.4, 0.5.
        self.assertAlmostEqual(s["reward_mean_first_third"], 0.05)
        self.assertAlmostEqual(s["reward_mean_last_third"], 0.45)
        self.assertAlmostEqual(s["response_length_first_third"], 15.0)
        self.assertAlmostEqual(s["response_length_last_third"], 55.0)
        self.assertEqual(s["first_reward"], 0.0)
        self.assertAlmostEqual(s["last_reward"], 0.5)
        # Rollout tokens/s 100..600: median 350; syncs of the 5 updating steps 1, 2, 4, 5, 6 ms.
        self.assertAlmostEqual(s["rollout_tokens_per_s_median"], 350.0)
        self.assertAlmostEqual(s["weight_sync_s_median"], 0.004)
        self.assertEqual(s["updated_steps"], 5)

    def test_png_without_and_with_kl_and_routing(self):
        for extra in [{}, {"kl": 0.01, "routing_differing": 0.03, "routing_coverage": 1.0}]:
            lines = [{"warm_start_step": 1, "loss": 2.0}] + [step(i, **extra) for i in range(1, 5)]
            code, out = self.run_tool(lines)
            self.assertEqual(code, 0)
            with open(out, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
            self.assertGreater(os.path.getsize(out), 10000)
            os.remove(out)

    def test_no_step_lines(self):
        code, out = self.run_tool([{"warm_start_step": 1, "loss": 2.0}])
        self.assertEqual(code, 2)
        self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    unittest.main()
