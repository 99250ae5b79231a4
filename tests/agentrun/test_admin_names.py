"""Django admin names its models in plain English."""

import pytest

from tests.base import PASSWORD, make_people

pytestmark = pytest.mark.django_db


def test_the_admin_index_lists_ledger_entries_and_api_tokens_by_their_proper_names(client):
    make_people()
    assert client.login(username="ada", password=PASSWORD)

    page = client.get("/admin/").content.decode()

    assert "Ledger entries" in page
    assert "API tokens" in page
    assert "entrys" not in page
    assert "Api tokens" not in page
