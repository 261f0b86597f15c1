#!/usr/bin/env python3
"""Tests of harness/report/round_index.py's reading of sanitize.txt: a tool's verdict with its case counts,
and a pass the tool ended early (no case summary) said so, not as an empty count.
Prints one line "round_index: N passed, N failed" (tests/run_tests.sh sums it)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness", "report"))
import round_index  # noqa: E402

CASES = [
    ("a clean pass",
     "sanitize initcheck: exit 0; 107 passed, 0 failed, 0 skipped; ========= ERROR SUMMARY: 0 errors",
     ["initcheck exit 0 (107 cases passed, 0 failed; 0 errors)"]),
    ("memcheck over two tiers",
     "sanitize memcheck: exit 0; 107 passed, 0 failed, 0 skipped;84 passed, 0 failed, 0 skipped; "
     "========= LEAK SUMMARY: 0 bytes leaked in 0 allocations;========= ERROR SUMMARY: 0 errors",
     ["memcheck exit 0 (107+84 cases passed, 0 failed; 0 bytes leaked, 0 errors)"]),
    ("a pass the tool ended early",
     "sanitize racecheck: exit 1; no case summary; ========= RACECHECK SUMMARY: 1 hazard displayed "
     "(1 error, 0 warnings)",
     ["racecheck exit 1 (no case summary; 1 error, 1 hazard)"]),
    ("a line of another kind is skipped", "round: 299 s in all", []),
]


def main():
    passed = failed = 0
    for name, line, want in CASES:
        got = round_index.sanitize_verdicts(line)
        if got == want:
            passed += 1
        else:
            failed += 1
            print("FAIL round_index: %s: got %r, want %r" % (name, got, want))
    print("round_index: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
