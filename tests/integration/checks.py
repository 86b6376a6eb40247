"""The assertions of the end-to-end test scripts: check() records a failure and goes on (so one
run reports every broken expectation), summary() prints them and gives the exit status."""

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)
    return cond


def summary():
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        for f in FAILURES:
            print("  -", f)
        return 1
    print("all checks passed")
    return 0
