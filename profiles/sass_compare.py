#!/usr/bin/env python3
"""sass_compare.py BEFORE_DIR AFTER_DIR: which kernels' SASS changed between two `make sass` outputs.

Functions are matched by name across all *.sass files of each directory, so a kernel that moved to
another source file still matches. Names and code are normalized first: the hash nvcc puts in an
anonymous namespace's name (_GLOBAL__N__<hash>_<file>) and the source file identifiers differ with the
file's path, not with the code. Prints one line per function that is new, gone or changed, then a
count; exits 1 when any changed.

    make sass && cp -r build/sass /tmp/sass_before     # before the change
    make sass && python3 profiles/sass_compare.py /tmp/sass_before build/sass
"""
import os
import re
import sys

ANON_AT = re.compile(r"(\d+)(_GLOBAL__N__)")


def strip_anon(text):
    """Replace each anonymous namespace's mangled identifier (its length, then _GLOBAL__N__<hash>_<file>,
    as long as the length says) by ANON: it names the source file, not the code."""
    out, i = [], 0
    for m in ANON_AT.finditer(text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        out.append("ANON")
        i = m.start(2) + int(m.group(1))
    out.append(text[i:])
    return "".join(out)


def functions(folder):
    out = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".sass"):
            continue
        arch, fn, body = "", None, []
        with open(os.path.join(folder, name)) as f:
            for line in f:
                # a section header (Fatbin ..., arch, code for, identifier) ends the function before it
                if line.startswith(("Fatbin", "arch = ", "code for", "identifier")) or line.strip().startswith("code for"):
                    if fn:
                        out[(arch, fn)] = "".join(body)
                    fn, body = None, []
                    if line.startswith("arch = "):
                        arch = line.split("=", 1)[1].strip()
                    continue
                m = re.match(r"\s*Function : (\S+)", line)
                if m:
                    if fn:
                        out[(arch, fn)] = "".join(body)
                    fn, body = strip_anon(m.group(1)), []
                elif fn is not None and line.strip():
                    # cuobjdump pads columns to the longest name in the file: compare tokens, not spacing
                    body.append(" ".join(strip_anon(line).split()) + "\n")
        if fn:
            out[(arch, fn)] = "".join(body)
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = functions(sys.argv[1]), functions(sys.argv[2])
    changed = 0
    for key in sorted(set(a) | set(b)):
        if key not in b:
            print("gone    %s %s" % key)
        elif key not in a:
            print("new     %s %s" % key)
        elif a[key] != b[key]:
            print("changed %s %s" % key)
        else:
            continue
        changed += 1
    print("sass_compare: %d functions, %d same, %d new, gone or changed" % (len(set(a) | set(b)), len(set(a) | set(b)) - changed, changed))
    sys.exit(1 if changed else 0)


if __name__ == "__main__":
    main()
