"""Counts the frames of a SQLite WAL by the B-tree (table or index) each page belongs to.

Usage: python3 count.py FOLDER, where FOLDER holds `db` and `db-wal` as server.sh leaves them.
"""
import collections
import os
import shutil
import sqlite3
import struct
import sys
import tempfile

folder = sys.argv[1]
with open(os.path.join(folder, "db-wal"), "rb") as f:
    wal = f.read()
page_size = struct.unpack(">I", wal[8:12])[0]
salt = wal[16:24]
frames = []
offset = 32
while offset + 24 + page_size <= len(wal):
    header = wal[offset : offset + 24]
    if header[8:16] != salt:
        break  # left over from before the WAL was last reset
    page, commit_size = struct.unpack(">II", header[:8])
    frames.append((page, commit_size != 0))
    offset += 24 + page_size

# Which B-tree owns each page, on a copy with the WAL applied (reading it would otherwise
# checkpoint into the original).
with tempfile.TemporaryDirectory() as tmp:
    shutil.copy(os.path.join(folder, "db"), os.path.join(tmp, "db"))
    shutil.copy(os.path.join(folder, "db-wal"), os.path.join(tmp, "db-wal"))
    conn = sqlite3.connect(os.path.join(tmp, "db"))
    owner = {page: name for name, page in conn.execute("SELECT name, pageno FROM dbstat")}
    conn.close()

owner[1] = "page 1 (file header: page count)"
counts = collections.Counter(owner.get(page, "free pages") for page, _ in frames)
commits = sum(commit for _, commit in frames)
print(f"page size {page_size}, {len(frames)} frames, {commits} commits, "
      f"{len({page for page, _ in frames})} distinct pages")
for name, n in counts.most_common():
    print(f"{name:40} {n:9}")
