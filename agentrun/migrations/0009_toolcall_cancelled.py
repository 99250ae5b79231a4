"""Tool calls get a "cancelled" status: the calls of a cancelled run that never started."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agentrun', '0008_event_no_truncate'),
    ]

    operations = [
        migrations.AlterField(
            model_name='toolcall',
            name='status',
            field=models.CharField(choices=[('planned', 'Planned'), ('awaiting_approval', 'Awaiting Approval'), ('intent', 'Intent'), ('ok', 'Ok'), ('failed', 'Failed'), ('in_doubt', 'In Doubt'), ('compensated', 'Compensated'), ('skipped', 'Skipped'), ('rejected', 'Rejected'), ('replayed', 'Replayed'), ('cancelled', 'Cancelled')], max_length=20),
        ),
    ]
