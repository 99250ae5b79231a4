"""An operator downloads a run's archive from the run page; imported elsewhere, the run
opens read-only with the same states."""

from __future__ import annotations

import gzip
import json
from functools import partial

import pytest

from agentrun.lifecycle import archive
from agentrun.models import Run
from tests.agentrun import archives
from tests.agentrun.test_archive_export_import import forget
from tests.base import make_people
from tests.debugger.browser import chromium, login, page_for, settle, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def test_an_operator_downloads_a_forks_archive_and_it_imports_read_only(
    live_server, browser, tmp_path
):
    people = make_people()
    parent = archives.finished_run(people["operator"])
    fork = archives.edited_fork(parent, people["operator"])
    before = archives.hashes([parent.pk, fork.pk])

    with page_for(browser, live_server.url) as (page, watch):
        login(page, "olga")
        page.goto(f"/runs/{fork.pk}/")
        settle(page)
        block = page.locator(".archive-block")
        assert block.locator("[data-action=export]").is_visible()
        shot(page, "60-run-page-archive-block", full_page=False)

        with page.expect_download() as download_info:
            page.click(".archive-block [data-action=export-ancestors]")
        download = download_info.value
        assert download.suggested_filename == f"run-{fork.pk}.agentrun.jsonl.gz"
        path = tmp_path / download.suggested_filename
        download.save_as(path)

        data = path.read_bytes()
        lines = [json.loads(line) for line in gzip.decompress(data).splitlines()]
        manifest = lines[0]
        assert manifest["run"] == str(fork.pk) and manifest["exported_by"] == "olga"
        assert [r["id"] for r in manifest["runs"]] == [str(parent.pk), str(fork.pk)]
        assert lines[-1]["type"] == "end"

        # The same archive, imported where its runs are not.
        forget(parent, fork)
        runs = archive.import_archive(partial(path.open, "rb"), user=people["operator"])
        assert [r.pk for r in runs] == [parent.pk, fork.pk]
        assert archives.hashes([parent.pk, fork.pk]) == before

        page.goto(f"/runs/{fork.pk}/")
        settle(page)
        callout = page.locator(".archive-block .callout.imported")
        assert "imported · read-only" in callout.inner_text()
        assert "by olga" in callout.inner_text()
        assert page.locator("[data-action=cancel]").count() == 0
        shot(page, "61-imported-run-page")
        page.goto(f"/runs/{fork.pk}/steps/4/diff/")
        assert page.locator("h1").inner_text() == "What step 4 changed"
        shot(page, "62-imported-run-diff", full_page=False)
        assert watch.unexpected_requests() == []
        assert watch.errors == [] and watch.dialogs == []
    assert Run.objects.get(pk=fork.pk).imported_at is not None
