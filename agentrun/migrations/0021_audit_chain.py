"""The event log's hash chains (agentrun.audit.chain): each event's stream, position and
hash, set by the database as the row is inserted; each stream's head in its own table.

Existing events are chained first, in the order they were written. Then:

- PostgreSQL: a BEFORE INSERT trigger, running as the tables' owner (SECURITY DEFINER),
  takes the time from the database's clock, the actor and user from the transaction's
  settings `agentrun.actor` and `agentrun.user_id` ('system' and none when unset), the
  role from the session, locks the stream's head row, and sets the position and hash.
  Events of an imported run keep the time and actor of the archive they came from.
- SQLite: an AFTER INSERT trigger sets the stream, position and hash through functions
  every connection registers (agentrun.apps); SQLite lets one writer at a time in.
"""

from django.conf import settings
from django.db import migrations, models
from django.db.models import TextField
from django.db.models.functions import Cast

from agentrun.audit import chain

PG_FORWARD = """
-- STABLE as convert_to is: so it is inlined into the trigger's expression (an IMMUTABLE
-- function calling a STABLE one is not, and runs the SQL executor for each field).
CREATE OR REPLACE FUNCTION agentrun_audit_field(value text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT octet_length(convert_to(coalesce(value, ''), 'UTF8'))::text
        || ':' || coalesce(value, '') || E'\\n'
$$;

CREATE OR REPLACE FUNCTION agentrun_event_chain() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    head_seq bigint;
    head_hash text;
BEGIN
    IF NEW.run_id IS NULL OR NOT EXISTS (
        SELECT 1 FROM agentrun_run WHERE id = NEW.run_id AND imported_at IS NOT NULL
    ) THEN
        NEW.created_at := clock_timestamp();
        NEW.actor := coalesce(nullif(current_setting('agentrun.actor', true), ''), 'system');
        NEW.user_id := nullif(current_setting('agentrun.user_id', true), '')::bigint;
    END IF;
    NEW.db_role := session_user;
    NEW.stream := CASE WHEN NEW.run_id IS NOT NULL AND NEW.user_id IS NULL
        THEN 'run:' || NEW.run_id::text ELSE 'operator' END;
    SELECT seq, hash INTO head_seq, head_hash FROM agentrun_audithead
        WHERE stream = NEW.stream FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO agentrun_audithead (stream, seq, hash) VALUES (NEW.stream, 0, '')
            ON CONFLICT (stream) DO NOTHING;
        SELECT seq, hash INTO head_seq, head_hash FROM agentrun_audithead
            WHERE stream = NEW.stream FOR UPDATE;
    END IF;
    NEW.seq := head_seq + 1;
    NEW.prev_hash := head_hash;
    NEW.hash := encode(sha256(convert_to(
        'agentrun-audit-1' || E'\\n'
        || agentrun_audit_field(NEW.stream)
        || agentrun_audit_field(NEW.seq::text)
        || agentrun_audit_field(NEW.prev_hash)
        || agentrun_audit_field(NEW.id::text)
        || agentrun_audit_field(NEW.run_id::text)
        || agentrun_audit_field(NEW.step::text)
        || agentrun_audit_field(NEW.kind)
        || agentrun_audit_field(NEW.actor)
        || agentrun_audit_field(NEW.user_id::text)
        || agentrun_audit_field(NEW.db_role)
        || agentrun_audit_field(to_char(NEW.created_at AT TIME ZONE 'UTC',
                                        'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
        || agentrun_audit_field(NEW.reason)
        || agentrun_audit_field(NEW.payload::text), 'UTF8')), 'hex');
    UPDATE agentrun_audithead SET seq = NEW.seq, hash = NEW.hash WHERE stream = NEW.stream;
    RETURN NEW;
END;
$$;

CREATE TRIGGER agentrun_event_chain
    BEFORE INSERT ON agentrun_event
    FOR EACH ROW EXECUTE FUNCTION agentrun_event_chain();
"""

PG_BACKWARD = """
DROP TRIGGER IF EXISTS agentrun_event_chain ON agentrun_event;
DROP FUNCTION IF EXISTS agentrun_event_chain();
DROP FUNCTION IF EXISTS agentrun_audit_field(text);
"""

_S = "agentrun_audit_stream(NEW.run_id, NEW.user_id)"
SQLITE_FORWARD = f"""
CREATE TRIGGER agentrun_event_chain AFTER INSERT ON agentrun_event
BEGIN
    INSERT INTO agentrun_audithead (stream, seq, hash) VALUES ({_S}, 0, '')
        ON CONFLICT (stream) DO NOTHING;
    UPDATE agentrun_audithead SET seq = seq + 1 WHERE stream = {_S};
    UPDATE agentrun_event SET
        stream = {_S},
        seq = (SELECT seq FROM agentrun_audithead WHERE stream = {_S}),
        prev_hash = (SELECT hash FROM agentrun_audithead WHERE stream = {_S}),
        db_role = '',
        hash = agentrun_audit_hash(
            {_S},
            (SELECT seq FROM agentrun_audithead WHERE stream = {_S}),
            (SELECT hash FROM agentrun_audithead WHERE stream = {_S}),
            NEW.id, NEW.run_id, NEW.step, NEW.kind, NEW.actor, NEW.user_id, '',
            NEW.created_at, NEW.reason, NEW.payload)
        WHERE id = NEW.id;
    UPDATE agentrun_audithead SET hash = (SELECT hash FROM agentrun_event WHERE id = NEW.id)
        WHERE stream = {_S};
END;
"""

SQLITE_BACKWARD = "DROP TRIGGER IF EXISTS agentrun_event_chain;"

BATCH = 5000


def chain_existing(apps, schema_editor):
    """Chain the events written before chains existed, in the order they were written."""
    conn = schema_editor.connection
    Event = apps.get_model("agentrun", "Event")
    AuditHead = apps.get_model("agentrun", "AuditHead")
    pg = conn.vendor == "postgresql"
    rows = (
        Event.objects.annotate(payload_text=Cast("payload", output_field=TextField()))
        .order_by("created_at", "id")
        .values_list(
            "id", "run_id", "step", "kind", "actor", "user_id", "created_at", "reason",
            "payload_text",
        )
    )
    heads: dict[str, tuple[int, str]] = {}
    updates: list[tuple] = []
    with conn.cursor() as cursor:
        if pg:
            cursor.execute("ALTER TABLE agentrun_event DISABLE TRIGGER agentrun_event_append_only")
        for id_, run_id, step, kind, actor, user_id, created_at, reason, payload in rows.iterator(
            chunk_size=BATCH
        ):
            stream = chain.stream_of(run_id, user_id)
            seq, prev = heads.get(stream, (0, ""))
            seq += 1
            values = [stream, seq, prev, id_, run_id, step, kind, actor, user_id, "",
                      chain.time_text(created_at), reason, payload]
            digest = chain.digest(["" if v is None else str(v) for v in values])
            heads[stream] = (seq, digest)
            updates.append((stream, seq, prev, digest, id_))
            if len(updates) >= BATCH:
                _write(cursor, updates)
        _write(cursor, updates)
        if pg:
            cursor.execute("ALTER TABLE agentrun_event ENABLE TRIGGER agentrun_event_append_only")
    AuditHead.objects.bulk_create(
        [AuditHead(stream=s, seq=seq, hash=h) for s, (seq, h) in heads.items()], batch_size=BATCH
    )


def _write(cursor, updates):
    cursor.executemany(
        "UPDATE agentrun_event SET stream = %s, seq = %s, prev_hash = %s, hash = %s WHERE id = %s",
        updates,
    )
    updates.clear()


def triggers(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_FORWARD.replace("%", "%%"))
    elif vendor == "sqlite":
        schema_editor.execute(SQLITE_FORWARD)


def no_triggers(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_BACKWARD)
    elif vendor == "sqlite":
        schema_editor.execute(SQLITE_BACKWARD)



class Migration(migrations.Migration):

    dependencies = [
        ('agentrun', '0020_saved_views_and_webhooks'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='AuditHead',
            fields=[
                ('stream', models.CharField(max_length=60, primary_key=True, serialize=False)),
                ('seq', models.BigIntegerField(default=0)),
                ('hash', models.CharField(default='', max_length=64)),
            ],
        ),
        migrations.AddField(
            model_name='event',
            name='db_role',
            field=models.CharField(db_default='', default='', editable=False, max_length=63),
        ),
        migrations.AddField(
            model_name='event',
            name='hash',
            field=models.CharField(db_default='', default='', editable=False, max_length=64),
        ),
        migrations.AddField(
            model_name='event',
            name='prev_hash',
            field=models.CharField(db_default='', default='', editable=False, max_length=64),
        ),
        migrations.AddField(
            model_name='event',
            name='seq',
            field=models.BigIntegerField(db_default=0, default=0, editable=False),
        ),
        migrations.AddField(
            model_name='event',
            name='stream',
            field=models.CharField(db_default='', default='', editable=False, max_length=60),
        ),
        migrations.RunPython(chain_existing, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name='event',
            constraint=models.UniqueConstraint(condition=models.Q(('seq__gt', 0)), fields=('stream', 'seq'), name='event_stream_seq'),
        ),
        migrations.RunPython(triggers, no_triggers),
    ]
