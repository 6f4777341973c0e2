"""The scenario's HTTP client where curl does not fit (one long watch as one process, many
requests over one connection) and its reading of what curl fetched. Authenticates with the
scenario's client certificate; the server's own certificate is self-signed, so it is not
verified (loopback only).

    client.py watch URL PATH CERT KEY          one "TYPE NAME" line per event, bookmarks left
                                               out (an ERROR prints its code), until the stream ends
    client.py create URL PATH CERT KEY GROUP N creates widgets bulk-001..bulk-N; one status a line
    client.py metric FILE NAME LABEL=VALUE...  the sum of the samples of metric NAME with exactly
                                               those labels in the Prometheus text FILE
    client.py summary FILE                     a watch stream's events, one line each; a run of
                                               ADDED is one line "ADDED xN", a bookmark prints
                                               its initial-events-end annotation
"""

import http.client
import json
import re
import ssl
import sys
import urllib.parse


def connect(url, cert, key, timeout):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(cert, key)
    u = urllib.parse.urlsplit(url)
    return http.client.HTTPSConnection(u.hostname, u.port, context=ctx, timeout=timeout)


def watch(url, path, cert, key):
    # No read timeout: a watch is quiet for as long as nothing changes. The scenario stops it.
    conn = connect(url, cert, key, None)
    conn.request("GET", path)
    resp = conn.getresponse()
    if resp.status != 200:
        print("HTTP", resp.status, flush=True)
        return
    for line in resp:
        event = json.loads(line)
        obj = event["object"]
        if event["type"] == "BOOKMARK":
            continue
        if event["type"] == "ERROR":
            print("ERROR", obj.get("code"), flush=True)
        else:
            print(event["type"], obj["metadata"]["name"], flush=True)


def create(url, path, cert, key, group, count):
    conn = connect(url, cert, key, 30)
    for i in range(1, int(count) + 1):
        body = {
            "apiVersion": group + "/v1",
            "kind": "Widget",
            "metadata": {"name": "bulk-%03d" % i},
            "spec": {"size": i},
        }
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        print(resp.status)


def metric(path, name, *labels):
    want = dict(label.split("=", 1) for label in labels)
    sample = re.compile(re.escape(name) + r"\{([^}]*)\} (\S+)$")
    total = 0.0
    with open(path) as text:
        for line in text:
            m = sample.match(line.strip())
            if m and dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))) == want:
                total += float(m.group(2))
    print(int(total))


def summary(path):
    out = []
    with open(path) as stream:
        for line in stream:
            event = json.loads(line)
            meta = event["object"]["metadata"]
            if event["type"] == "BOOKMARK":
                end = (meta.get("annotations") or {}).get("k8s.io/initial-events-end")
                out.append("BOOKMARK initial-events-end=%s" % end)
            elif event["type"] == "ADDED" and (not out or out[-1].startswith("ADDED x")):
                n = int(out.pop()[len("ADDED x"):]) if out else 0
                out.append("ADDED x%d" % (n + 1))
            else:
                out.append("%s %s" % (event["type"], meta["name"]))
    print("\n".join(out))


if __name__ == "__main__":
    {"watch": watch, "create": create, "metric": metric, "summary": summary}[sys.argv[1]](*sys.argv[2:])
