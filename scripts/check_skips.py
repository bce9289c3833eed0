#!/usr/bin/env python3
"""check_skips.py — a green test run must not hide tests that never ran.

Usage: check_skips.py STAGE RESULT...
  STAGE   the CI stage's name, for the summary line;
  RESULT  a ctest build folder (its Testing/Temporary/LastTest.log is read) or a GoogleTest
          XML report (--gtest_output=xml:FILE).

Every skipped GoogleTest case must give an allowed reason as the opening words of its
message (tests/util/skip_reason.h):
  [allowed: no-gpu]      a real-GPU test where no GPU is usable;
  [allowed: isa NAME]    a SIMD path (avx2, avx512) this CPU cannot run.
Any other skip (no OpenGL, no model, no long text), and a ctest entry that says Skipped with
no GoogleTest skip in its output, fails the check; the tests are named.

Prints one summary line: the count of each allowed skip, and which SIMD paths ran here
(a path ran when a per-path case of it, ".../avx512", or its KVSCOPE_CPU_ISA dispatch
test, engine_cpu_isa_env_avx512, passed) and which did not. Exit status 1 on a skip that is
not allowed, 0 otherwise.
"""
import os
import re
import sys
import xml.etree.ElementTree as ET

ISAS = ("scalar", "avx2", "avx512")
ALLOWED = re.compile(r"\[allowed: (no-gpu|isa (?:avx2|avx512))\]")


class Results:
    def __init__(self):
        self.allowed = {}  # reason -> count
        self.bad = []  # "test: message"
        self.isa_ran = set()
        self.isa_lacking = set()

    def skip(self, test, message):
        m = ALLOWED.search(message)
        if not m:
            # GoogleTest prints "FILE:LINE: Skipped" and then the message.
            lines = [l.strip() for l in message.splitlines() if l.strip()]
            after = [lines[i + 1] for i, l in enumerate(lines[:-1]) if l.endswith(": Skipped")]
            reason = (after or lines or ["(no message)"])[0]
            self.bad.append(f"{test}: {reason[:160]}")
            return
        reason = m.group(1)
        self.allowed[reason] = self.allowed.get(reason, 0) + 1
        if reason.startswith("isa "):
            self.isa_lacking.add(reason[4:])

    def passed(self, test):
        for isa in ISAS:
            if test.endswith("/" + isa) or test == "engine_cpu_isa_env_" + isa:
                self.isa_ran.add(isa)


# GoogleTest's console output: the message of each skipped case sits between its
# "[ RUN      ]" line and its "[  SKIPPED ]" line.
def gtest_console(entry, text, res):
    current, lines = None, []
    for line in text.splitlines():
        if line.startswith("[ RUN      ] "):
            current, lines = line[13:].strip(), []
        elif line.startswith("[  SKIPPED ] ") and current and line[13:].startswith(current):
            res.skip(f"{entry} ({current})" if entry != current else entry, "\n".join(lines))
            current = None
        elif line.startswith("[       OK ] ") and current:
            res.passed(current)
            current = None
        elif current:
            lines.append(line)


def ctest_log(path, res):
    text = open(path, errors="replace").read()
    # One block per test: "N/M Testing: NAME" ... "Output:" ... "<end of output>" ...
    # then "Test Passed." / "Test Failed.", or for an entry whose skip expression matched
    # "Test Pass Reason:" / "Skip regular expression found in output."
    blocks = re.split(r"^\d+/\d+ Testing: ", text, flags=re.M)[1:]
    for block in blocks:
        name = block.splitlines()[0].strip()
        out, _, tail = block.partition("<end of output>")
        if "Skip regular expression found in output" in tail:
            status = "Skipped"
        else:
            status = re.search(r"^Test (Passed|Failed)\.?$", tail, re.M)
            status = status.group(1) if status else "?"
        if status == "Passed":
            res.passed(name)
            gtest_console(name, out, res)  # an entry with no skip expression still counts
        elif status == "Skipped":
            before = len(res.bad) + sum(res.allowed.values())
            gtest_console(name, out, res)
            if len(res.bad) + sum(res.allowed.values()) == before:
                res.bad.append(f"{name}: skipped with no GoogleTest skip message")


def gtest_xml(path, res):
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}.{case.get('name')}"
        skipped = case.find("skipped")
        if skipped is not None:
            res.skip(name, skipped.get("message", "") + "\n" + (skipped.text or ""))
        elif case.get("result", "completed") == "completed" and case.find("failure") is None:
            res.passed(name)


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    stage, res = argv[1], Results()
    for item in argv[2:]:
        log = os.path.join(item, "Testing", "Temporary", "LastTest.log")
        if os.path.isdir(item):
            if not os.path.exists(log):
                print(f"check_skips: no ctest log in {item}", file=sys.stderr)
                return 2
            ctest_log(log, res)
        else:
            gtest_xml(item, res)
    counts = ", ".join(f"{n} {r}" for r, n in sorted(res.allowed.items())) or "none"
    ran = [i for i in ISAS if i in res.isa_ran]
    not_run = [i for i in ISAS if i in res.isa_lacking and i not in res.isa_ran]
    isa = f"SIMD paths run: {' '.join(ran) or '(none tested in this stage)'}"
    if not_run:
        isa += f"; NOT run (this CPU lacks them): {' '.join(not_run)}"
    print(f"== {stage}: allowed skips: {counts}; {isa}")
    if res.bad:
        print(f"FAIL {stage}: {len(res.bad)} skipped for a reason CI must not have:")
        for b in res.bad:
            print(f"  {b}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
