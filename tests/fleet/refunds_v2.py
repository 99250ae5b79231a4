"""v2 of the `refunds` agent: the refund is the order's total, whatever its items."""

from agentrun.agents import register
from tests.fleet.refunds import Refunds


@register
class RefundsV2(Refunds):
    per_item = False
