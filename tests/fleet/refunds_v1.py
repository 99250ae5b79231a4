"""v1 of the `refunds` agent: the refund policy fails on an order with no items."""

from agentrun.agents import register
from tests.fleet.refunds import Refunds


@register
class RefundsV1(Refunds):
    per_item = True
