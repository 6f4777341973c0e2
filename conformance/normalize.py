#!/usr/bin/env python3
"""Normalize etcdctl output so that real etcd and etcdsql can be compared.

Reads raw scenario output on stdin, writes normalized output on stdout.
Python 3 stdlib only.

What is normalized (everything else is compared byte for byte):
  * 127.0.0.1:<port>                      -> 127.0.0.1:<PORT>
  * etcdctl's zap log lines ({"level":...}) -> "[etcdctl log] LEVEL: msg | error"
    (timestamps, caller and the random client target are dropped; the gRPC
    code and message in "error" are kept, they are part of the contract)
  * JSON output lines (-w json):
      header.cluster_id / member_id        -> <CLUSTER_ID#n> / <MEMBER_ID#n>
                                              (numbered by first appearance, so
                                              "leader == member_id" is still
                                              asserted; 0/absent stays as is)
      raft_term, raftTerm                  -> <RAFT_TERM>   (if non-zero)
      raftIndex, raftAppliedIndex          -> <RAFT_INDEX>  (if non-zero)
      dbSize, dbSizeInUse                  -> <DB_SIZE>     (if non-zero)
      Status.version (a string)            -> <VERSION>
      Status.leader                        -> <MEMBER_ID#n>
      members[].ID / name / peerURLs[]     -> <MEMBER_ID#n> / <NAME> / <PEER_URL>
      health "took"                        -> <TOOK>
      kv "lease", lease "ID"               -> <LEASE#n>     (if non-zero)
      time-to-live "TTL" (beside "grantedTTL") -> <TTL>     (if in 1..grantedTTL)
  * text: "took = 1.2ms"                   -> "took = <TOOK>"
          "lease 694d8a...": hex lease ids -> "lease <LEASE#n>" (same numbering
                                              as the JSON lease ids)
          "remaining(599s)"                -> "remaining(<TTL>s)"
          "Leadership transferred from X to Y": hex member ids -> <MEMBER_ID#n>
          "memberID:N alarm:" (alarm list)   -> "memberID:<MEMBER_ID#n> alarm:"
          "attached keys([b a])"           -> "attached keys([a b])" (etcd's
                                              order is a Go map's: undefined)
"""
import json
import re
import sys

PORT_RE = re.compile(r"127\.0\.0\.1:\d+")
TOOK_RE = re.compile(r"took = [0-9.]+(?:ns|µs|us|ms|s|m|h)[0-9.a-zµ]*")
LEASE_TXT_RE = re.compile(r"\blease ([0-9a-f]{16})\b")
REMAINING_RE = re.compile(r"remaining\(-?\d+s\)")
ATTACHED_RE = re.compile(r"attached keys\(\[([^\]]*)\]\)")
ALARM_RE = re.compile(r"memberID:(\d+) alarm:")
TRANSFER_RE = re.compile(r"Leadership transferred from ([0-9a-f]+) to ([0-9a-f]+)")


class Ids:
    def __init__(self):
        self.maps = {}

    def get(self, kind, value):
        m = self.maps.setdefault(kind, {})
        if value not in m:
            m[value] = "<%s#%d>" % (kind, len(m) + 1)
        return m[value]


IDS = Ids()


def lease_placeholder(v):
    # v: int (JSON) or hex string (text); key the map by lower-case hex
    if isinstance(v, int):
        if v == 0:
            return 0
        key = "%016x" % (v & 0xFFFFFFFFFFFFFFFF)
    else:
        key = v.lower()
    return IDS.get("LEASE", key)


def nonzero(v, placeholder):
    if v in (0, None, "", "0"):
        return v
    return placeholder


def norm(obj, ctx=""):
    if isinstance(obj, list):
        return [norm(x, ctx) for x in obj]
    if not isinstance(obj, dict):
        return obj
    out = {}
    for k, v in obj.items():
        if k == "cluster_id":
            out[k] = v if not v else IDS.get("CLUSTER_ID", v)
        elif k in ("member_id", "leader") and not isinstance(v, (dict, list)):
            # (An election's "leader" is an object, not a member id.)
            out[k] = v if not v else IDS.get("MEMBER_ID", v)
        elif k in ("raft_term", "raftTerm"):
            out[k] = nonzero(v, "<RAFT_TERM>")
        elif k in ("raftIndex", "raftAppliedIndex"):
            out[k] = nonzero(v, "<RAFT_INDEX>")
        elif k in ("dbSize", "dbSizeInUse"):
            out[k] = nonzero(v, "<DB_SIZE>")
        elif k == "version" and isinstance(v, str):
            out[k] = "<VERSION>"
        elif k == "took":
            out[k] = "<TOOK>"
        elif k == "members" and isinstance(v, list):
            out[k] = [norm(m, "member") for m in v]
        elif ctx == "member" and k == "ID":
            out[k] = v if not v else IDS.get("MEMBER_ID", v)
        elif ctx == "member" and k == "name":
            out[k] = "<NAME>"
        elif ctx == "member" and k == "peerURLs" and isinstance(v, list):
            out[k] = ["<PEER_URL>" for _ in v]
        elif k == "TTL" and "grantedTTL" in obj and remaining_ttl(v, obj["grantedTTL"]):
            out[k] = "<TTL>"
        elif k in ("lease", "ID") and isinstance(v, int):
            out[k] = lease_placeholder(v)
        else:
            out[k] = norm(v, "")
    return out


def remaining_ttl(ttl, granted):
    """Whether a time-to-live answer's TTL is a plausible remainder of its granted TTL (how
    much remains depends on how long the scenario took to get there)."""
    try:
        return 0 < int(ttl) <= int(granted)
    except (TypeError, ValueError):
        return False


def norm_log(obj):
    level = obj.get("level", "?")
    msg = obj.get("msg", "")
    err = obj.get("error")
    s = "[etcdctl log] %s: %s" % (level, msg)
    if err is not None:
        s += " | " + str(err)
    return s


def norm_line(line):
    line = PORT_RE.sub("127.0.0.1:<PORT>", line)
    stripped = line.strip()
    if stripped[:1] in ("{", "["):
        try:
            obj = json.loads(stripped)
        except ValueError:
            obj = None
        if obj is not None:
            if isinstance(obj, dict) and "level" in obj and "msg" in obj:
                return norm_log(obj)
            return json.dumps(norm(obj), separators=(",", ":"), ensure_ascii=False)
    line = TOOK_RE.sub("took = <TOOK>", line)
    line = LEASE_TXT_RE.sub(lambda m: "lease " + lease_placeholder(m.group(1)), line)
    line = REMAINING_RE.sub("remaining(<TTL>s)", line)
    line = ALARM_RE.sub(
        lambda m: "memberID:%s alarm:" % IDS.get("MEMBER_ID", int(m.group(1))), line)
    line = TRANSFER_RE.sub(
        lambda m: "Leadership transferred from %s to %s" % tuple(
            IDS.get("MEMBER_ID", int(h, 16)) for h in m.groups()), line)
    line = ATTACHED_RE.sub(
        lambda m: "attached keys([%s])" % " ".join(sorted(m.group(1).split())), line)
    return line


def main():
    data = sys.stdin.buffer.read().decode("utf-8", errors="backslashreplace")
    lines = data.split("\n")
    trailing_nl = data.endswith("\n")
    if trailing_nl:
        lines = lines[:-1]
    out = [norm_line(l) for l in lines]
    sys.stdout.write("\n".join(out) + ("\n" if trailing_nl else ""))


if __name__ == "__main__":
    main()
