"""Everything in the admin is read-only: the engine and the operators' actions
are the only writers, and they leave events."""

from django.contrib import admin
from django.http import HttpRequest

from agentrun import models


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(models.Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ("id", "agent", "status", "phase", "next_step", "created_at")
    list_filter = ("status", "agent")
    search_fields = ("id", "agent")


@admin.register(models.Step)
class StepAdmin(ReadOnlyAdmin):
    list_display = ("run", "number", "status", "attempts", "phase_before", "phase_after")
    list_filter = ("status",)


@admin.register(models.Snapshot)
class SnapshotAdmin(ReadOnlyAdmin):
    list_display = ("run", "step", "at", "kind", "size", "stored_bytes", "hash")
    list_filter = ("kind", "at")


@admin.register(models.ToolCall)
class ToolCallAdmin(ReadOnlyAdmin):
    list_display = ("idempotency_key", "tool", "kind", "status", "created_at")
    list_filter = ("kind", "status", "tool")
    search_fields = ("idempotency_key", "tool")


@admin.register(models.Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "kind", "actor", "run", "step")
    list_filter = ("kind",)
    search_fields = ("actor", "kind")


@admin.register(models.WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "event", "run", "step", "status", "attempts", "last_error")
    list_filter = ("status", "event")


for model in (
    models.LedgerEntry,
    models.LedgerInvocation,
    models.OutboxMessage,
    models.InventoryItem,
    models.Reservation,
    models.ApiToken,
):
    admin.site.register(model, ReadOnlyAdmin)
