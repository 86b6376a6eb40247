#!/usr/bin/env python3
"""loom-chat-template against the chat template fixtures: every case of every
../shared/fixtures/chat_templates/<name>/cases.json through the tool, one JSON line each, equal to the
expected text (the case that apply_chat_template refuses answers {"error": ...}, and --raw renders
it); plus the answers to malformed lines and the exit status for a folder without a template.

usage: loom_chat_template_test.py LOOM_CHAT_TEMPLATE FIXTURES_DIR
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def run(tool, folder, lines, *flags):
    out = subprocess.run([tool, "--template", str(folder), *flags], input="".join(lines).encode(),
                         capture_output=True, check=False)
    return out.returncode, [json.loads(l) for l in out.stdout.decode().split("\n")[:-1]]


def main():
    tool, fixtures = sys.argv[1], Path(sys.argv[2]) / "chat_templates"
    failures = 0
    for folder in sorted(p for p in fixtures.iterdir() if (p / "cases.json").exists()):
        cases = json.loads((folder / "cases.json").read_text())["cases"]
        lines = [json.dumps({k: c[k] for k in ("messages", "tools", "add_generation_prompt",
                                               "kwargs")}, ensure_ascii=False) + "\n"
                 for c in cases]
        rc, got = run(tool, folder, lines)
        _, raw = run(tool, folder, lines, "--raw")
        ok = 0
        for c, g, r in zip(cases, got, raw):
            if "apply_chat_template_error" in c:
                ok += isinstance(g, dict) and "empty conversation" in g.get("error", "") and \
                    r == c["expected"]
            else:
                ok += g == c["expected"] and r == c["expected"]
        print(f"{folder.name}: {ok}/{len(cases)}")
        if rc != 0 or ok != len(cases) or len(got) != len(cases):
            failures += 1

    folder = fixtures / "qwen3_next"
    rc, got = run(tool, folder, ["not json\n", '{"tools": []}\n', '{"messages": [], "x": 1}\n',
                                 '{"messages": [{"role": "user", "content": "a"}], '
                                 '"kwargs": {"messages": []}}\n'])
    expected_errors = ["not a JSON object", "missing field 'messages'", "unknown field 'x'",
                       "may not set 'messages'"]
    bad = [e for g, e in zip(got, expected_errors) if e not in g.get("error", "")]
    print(f"malformed lines: {len(expected_errors) - len(bad)}/{len(expected_errors)}")
    if rc != 0 or bad or len(got) != len(expected_errors):
        failures += 1

    with tempfile.TemporaryDirectory() as empty:
        rc, got = run(tool, empty, ['{"messages": []}\n'])
        print(f"folder without a template: exit {rc}")
        if rc != 1 or got:
            failures += 1
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
