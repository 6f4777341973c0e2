#!/usr/bin/env python3
"""Finds storage errors in an API server's log (kube-apiserver's, or apiextensions-apiserver's)
that an allowlist (allowed-log-errors.txt beside each run.sh) does not explain.

usage: check_log.py ALLOWLIST LOG [WINDOW=FROM:TO ...]

A line is looked at (a "candidate") when it is
  - a klog error or fatal line (E..../F....), whatever it is about;
  - a klog warning (W....) that mentions storage: etcd, grpc, watch, compaction, leases, ...;
  - a line of the etcd client's own JSON log at level warn or above;
  - a Go panic or fatal error.
Every candidate must match one pattern of ALLOWLIST. Patterns come in blocks: one or more
`# reason` lines, then `SCOPE REGEX` lines (Python regular expressions, searched in the line).
SCOPE `any` matches anywhere in the log; a window's name only in that window's lines FROM+1 ..
TO, as run.sh passes them (e.g. `restart=812:1034`: from stopping the store until kube-apiserver
wrote again after the restart; `after-restart=812:`, no TO, runs to the end of the log).

Prints each unexpected line and, per allowlist pattern, how many lines it allowed; exits 1 on
an unexpected line or a malformed allowlist (a pattern without a reason, a bad scope or regex).
"""
import json
import re
import sys

KLOG = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [^\]]+\] ")
STORAGE = re.compile(
    r"etcd|storage|grpc|clientv3|rpc error|transport|compact|watch|cacher|reflector|"
    r"resource ?version|revision|lease|timeout|deadline|failed to|connection",
    re.IGNORECASE,
)
PANIC = re.compile(r"^(panic: |fatal error: |goroutine \d+ \[)|SIGSEGV")
JSON_LEVELS = {"warn", "error", "dpanic", "panic", "fatal"}


def load_allowlist(path, scopes):
    """Returns [(scope, regex, reason)]; exits 2 on a malformed file."""
    rules, reason, errors = [], [], []
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.rstrip("\n")
            if not line.strip():
                reason = []
            elif line.startswith("#"):
                reason.append(line.lstrip("#").strip())
            else:
                scope, _, pattern = line.partition(" ")
                if not reason:
                    errors.append(f"{path}:{n}: pattern without a '# reason' line above it")
                elif scope not in scopes:
                    errors.append(f"{path}:{n}: scope must be one of {sorted(scopes)}, not {scope!r}")
                else:
                    try:
                        rules.append((scope, re.compile(pattern.strip()), " ".join(reason)))
                    except re.error as e:
                        errors.append(f"{path}:{n}: bad regular expression: {e}")
    if errors:
        print("\n".join(errors))
        sys.exit(2)
    return rules


def is_candidate(line):
    m = KLOG.match(line)
    if m:
        level = m.group(1)
        message = line[m.end():]
        return level in "EF" or (level == "W" and STORAGE.search(message) is not None)
    if line.startswith("{"):
        try:
            entry = json.loads(line)
        except ValueError:
            return False
        return isinstance(entry, dict) and entry.get("level") in JSON_LEVELS
    return PANIC.search(line) is not None


def main():
    if len(sys.argv) < 3:
        print(__doc__.split("\n\n")[1])
        sys.exit(2)
    allowlist, log = sys.argv[1:3]
    windows = {}
    for arg in sys.argv[3:]:
        name, _, span = arg.partition("=")
        start, _, end = span.partition(":")
        windows[name] = (int(start), int(end) if end else float("inf"))
    rules = load_allowlist(allowlist, {"any", *windows})
    counts = [0] * len(rules)
    unexpected = []
    with open(log, encoding="utf-8", errors="replace") as f:
        for n, raw in enumerate(f, 1):
            line = raw.rstrip("\n")
            if not is_candidate(line):
                continue
            for i, (scope, regex, _) in enumerate(rules):
                start, end = windows.get(scope, (0, n))
                if start < n <= end and regex.search(line):
                    counts[i] += 1
                    break
            else:
                unexpected.append((n, line))
    for i, (scope, regex, reason) in enumerate(rules):
        if counts[i]:
            print(f"allowed {counts[i]:4d} x [{scope}] {regex.pattern}\n               ({reason})")
    for n, line in unexpected:
        print(f"UNEXPECTED line {n}: {line[:400]}")
    print(f"{len(unexpected)} unexpected storage error line(s)")
    sys.exit(1 if unexpected else 0)


if __name__ == "__main__":
    main()
