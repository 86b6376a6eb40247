#!/usr/bin/env python3
"""loom-tokenize against the tokenizer fixtures: every encode case's ids through the tool (a TikToken
folder, its tiktoken.model file, a tokenizer.json), every decode (the cases' and decode_cases'
ids back to their decoded strings), and the errors for a folder without a tokenizer and a bad line.

usage: loom_tokenize_test.py LOOM_TOKENIZE FIXTURES_DIR
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def run(tool, path, lines, *flags):
    out = subprocess.run([tool, "--tokenizer", str(path), *flags], input="".join(lines).encode(),
                         capture_output=True, check=False)
    # One JSON value per line; split on "\n" only (decoded text may hold U+2028 and the like).
    return out.returncode, [json.loads(l) for l in out.stdout.decode().split("\n")[:-1]], out.stderr


def main():
    tool, fixtures = sys.argv[1], Path(sys.argv[2])
    failures = 0

    def check(name, got, cases, key):
        nonlocal failures
        ok = sum(g == c[key] for g, c in zip(got, cases))
        print(f"{name}: {ok}/{len(cases)}")
        if ok != len(cases) or len(got) != len(cases):
            failures += 1

    kimi = fixtures / "tokenizer_tiktoken_kimi"
    root = json.loads((kimi / "cases.json").read_text())
    texts = [json.dumps(c["text"]) + "\n" for c in root["cases"]]
    for path in (kimi, kimi / "tiktoken.model"):
        rc, got, _ = run(tool, path, texts)
        check(f"encode {path.name}", got if rc == 0 else [], root["cases"], "ids")
    decodes = root["cases"] + root["decode_cases"]
    rc, got, _ = run(tool, kimi, [json.dumps(c["ids"]) + "\n" for c in decodes], "--decode")
    check("decode tokenizer_tiktoken_kimi", got if rc == 0 else [], decodes, "decoded")

    qwen = json.loads((fixtures / "tokenizer_qwen" / "cases.json").read_text())["cases"]
    rc, got, _ = run(tool, fixtures / "tokenizer_qwen" / "tokenizer.json",
                     [json.dumps(c["text"]) + "\n" for c in qwen])
    check("encode tokenizer_qwen/tokenizer.json", got if rc == 0 else [], qwen, "ids")

    with tempfile.TemporaryDirectory() as empty:
        rc, _, err = run(tool, empty, ['"x"\n'])
        if rc != 1 or b"no tokenizer.json or tiktoken.model" not in err:
            print("an empty folder:", rc, err)
            failures += 1
    rc, _, err = run(tool, kimi, ['"x"\n', "[1]\n"])
    if rc != 1 or b"line 2: expected a JSON string" not in err:
        print("a bad line:", rc, err)
        failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
