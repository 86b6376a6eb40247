#!/usr/bin/python3
"""Unit tests of agent_trace.py (ctest agent_trace_test, label unit): the same seed gives the same
bytes and other seeds differ; lengths land within 1% of the target at every size from a few
thousand to a million tokens and for BPE-like chars_per_token; tool results stay in the stated
range; the message structure is OpenAI's (checked independently of check_conversation, which is
tested to reject broken traces); the CLI writes one valid conversation per line and refuses
impossible targets."""
import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import agent_trace  # noqa: E402


def text_chars(conv):
    n = 0
    for m in conv["messages"]:
        n += len(m.get("content") or "")
        for c in m.get("tool_calls", []):
            n += len(c["function"]["arguments"])
    return n


class AgentTraceTest(unittest.TestCase):
    def test_deterministic(self):
        a = json.dumps(agent_trace.generate(7, 20000, 12))
        b = json.dumps(agent_trace.generate(7, 20000, 12))
        self.assertEqual(a, b)
        self.assertNotEqual(a, json.dumps(agent_trace.generate(8, 20000, 12)))

    def test_lengths(self):
        for target, turns, cpt in [(4000, 3, 1.0), (16384, 30, 1.0), (65536, 30, 1.0),
                                   (65536, 30, 4.0), (1 << 20, 60, 1.0)]:
            conv = agent_trace.generate(3, target, turns, cpt)
            tokens = text_chars(conv) / cpt
            self.assertLessEqual(abs(tokens - target), 0.01 * target, (target, turns, cpt))
            self.assertEqual(conv["approx_tokens"], int(round(tokens)))
            results = [len(m["content"]) / cpt for m in conv["messages"] if m["role"] == "tool"]
            self.assertGreaterEqual(min(results), agent_trace.FLOOR_RESULT_TOKENS - 1)
            if target >= 1 << 20:
                # At a million tokens the results span hundreds to tens of thousands of tokens.
                self.assertLess(min(results), 1000)
                self.assertGreater(max(results), 20000)

    def test_structure(self):
        for seed in range(20):
            conv = agent_trace.generate(seed, 30000, 10)
            agent_trace.check_conversation(conv)
            msgs = conv["messages"]
            self.assertEqual([m["role"] for m in msgs[:2]], ["system", "user"])
            self.assertEqual(sum(m["role"] == "assistant" for m in msgs), 10)
            self.assertEqual(msgs[-1]["role"], "assistant")
            self.assertNotIn("tool_calls", msgs[-1])
            declared = {t["function"]["name"] for t in conv["tools"]}
            for t in conv["tools"]:
                self.assertEqual(t["type"], "function")
                self.assertEqual(t["function"]["parameters"]["type"], "object")
            ids = set()
            for i, m in enumerate(msgs):
                self.assertTrue(all(ord(ch) < 128 for ch in m["content"]), "ASCII only")
                for c in m.get("tool_calls", []):
                    self.assertIn(c["function"]["name"], declared)
                    self.assertIsInstance(json.loads(c["function"]["arguments"]), dict)
                    self.assertNotIn(c["id"], ids)
                    ids.add(c["id"])
                if m["role"] == "tool":
                    self.assertIn(m["tool_call_id"], ids)
                    # A tool result follows its own assistant message's calls only.
                    j = i - 1
                    while msgs[j]["role"] == "tool":
                        j -= 1
                    self.assertIn(m["tool_call_id"],
                                  [c["id"] for c in msgs[j].get("tool_calls", [])])

    def test_single_turn(self):
        conv = agent_trace.generate(1, 2000, 1)
        agent_trace.check_conversation(conv)
        self.assertEqual(len(conv["messages"]), 3)
        self.assertEqual(conv["approx_tokens"], 2000)

    def test_check_rejects(self):
        conv = agent_trace.generate(2, 10000, 5)
        broken = json.loads(json.dumps(conv))
        del broken["messages"][3]  # the first tool result
        with self.assertRaises(ValueError):
            agent_trace.check_conversation(broken)
        broken = json.loads(json.dumps(conv))
        broken["turns"] = 6
        with self.assertRaises(ValueError):
            agent_trace.check_conversation(broken)
        broken = json.loads(json.dumps(conv))
        broken["messages"].pop()  # no final answer: ends on a tool result
        with self.assertRaises(ValueError):
            agent_trace.check_conversation(broken)

    def test_bad_arguments(self):
        with self.assertRaises(ValueError):
            agent_trace.generate(0, 500, 30)
        with self.assertRaises(ValueError):
            agent_trace.generate(0, 5000, 0)
        with self.assertRaises(ValueError):
            agent_trace.generate(0, 5000, 3, 0.0)

    def test_cli(self):
        script = os.path.join(HERE, "agent_trace.py")
        out = subprocess.run([sys.executable, script, "--seed", "5", "--conversations", "3",
                              "--turns", "6", "--target_tokens", "8000"],
                             capture_output=True, text=True, check=True).stdout
        lines = out.splitlines()
        self.assertEqual(len(lines), 3)
        for i, line in enumerate(lines):
            conv = json.loads(line)
            agent_trace.check_conversation(conv)
            self.assertEqual(conv["seed"], 5 + i)
            self.assertEqual(json.dumps(conv), json.dumps(agent_trace.generate(5 + i, 8000, 6)))
        bad = subprocess.run([sys.executable, script, "--turns", "30", "--target_tokens", "100"],
                             capture_output=True, text=True)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("too small", bad.stderr)


if __name__ == "__main__":
    unittest.main()
