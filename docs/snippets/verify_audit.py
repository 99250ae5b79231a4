"""Verify an agentrun audit export offline: python3 verify_audit.py EXPORT.csv|EXPORT.jsonl

Recomputes each event's hash from its fields, and checks each link to the event before
it in its stream when both are in the file. Exits 1 naming the first broken link.
Needs only Python's standard library.
"""

import csv
import hashlib
import json
import sys

FIELDS = ["stream", "seq", "prev_hash", "id", "run_id", "step", "kind", "actor",
          "user_id", "db_role", "created_at", "reason", "payload"]  # fmt: skip


def event_hash(record):
    text = b"agentrun-audit-1\n"
    for name in FIELDS:
        value = record[name].encode()
        text += b"%d:%s\n" % (len(value), value)
    return hashlib.sha256(text).hexdigest()


def read(path):
    with open(path, encoding="utf-8", newline="") as f:
        if path.endswith(".csv"):
            # A cell that started like a spreadsheet formula was given a leading quote.
            return [{k: v[1:] if v[:1] == "'" else v for k, v in row.items()}
                    for row in csv.DictReader(f)]  # fmt: skip
        return [json.loads(line) for line in f if line.strip()]


def problems(records):
    """(event id, what is wrong) for each broken link; records in the export's order."""
    last = {}  # stream -> the record before, in this file
    for r in records:
        if event_hash(r) != r["hash"]:
            yield r["id"], "its fields do not hash to its hash"
        before = last.get(r["stream"])
        if before and int(before["seq"]) + 1 == int(r["seq"]) and before["hash"] != r["prev_hash"]:
            yield r["id"], f"its prev_hash is not the hash of event {before['id']}"
        if r["seq"] == "1" and r["prev_hash"]:
            yield r["id"], "it is its stream's first event, yet names a previous one"
        last[r["stream"]] = r


def main(path):
    records = read(path)
    for event_id, what in problems(records):
        print(f"broken at event {event_id}: {what}")
        return 1
    streams = {r["stream"] for r in records}
    print(f"verified: {len(records)} event(s) in {len(streams)} stream(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
