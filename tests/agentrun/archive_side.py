"""The far side of an export/import round trip, run as its own process with its own
DATABASE_URL (the test process keeps its database):

    python -m tests.agentrun.archive_side ARCHIVE REPORT.json [EXPORT_TO]

Migrates that database, imports ARCHIVE with `manage.py importrun`, writes a report
(every snapshot's stored hash and the hash of the state read back, and the diff pages
of the imported runs), and with EXPORT_TO exports the imported run again, with its
ancestors, with `manage.py exportrun`.
"""

from __future__ import annotations

import io
import json
import os
import sys


def main(archive_path: str, report_path: str, export_to: str | None) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")
    import django

    django.setup()
    from django.core.management import call_command

    from agentrun.models import Run
    from tests.agentrun.archives import hashes
    from tests.agentrun.test_archive_roundtrip import diff_pages
    from tests.base import make_people

    call_command("migrate", verbosity=0)
    out = io.StringIO()
    call_command("importrun", archive_path, stdout=out)
    run_id = out.getvalue().strip()
    make_people()
    run = Run.objects.get(pk=run_id)
    ids = [str(r.pk) for r in run.lineage() if Run.objects.filter(pk=r.pk).exists()]
    report = {
        "run": run_id,
        "runs": ids,
        "imported": run.imported_at is not None,
        "hashes": hashes(ids),
        "pages": diff_pages(ids),
    }
    with open(report_path, "w") as f:
        json.dump(report, f)
    if export_to:
        call_command("exportrun", run_id, "-o", export_to, "--with-ancestors")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
