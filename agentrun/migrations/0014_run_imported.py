from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agentrun", "0013_pins_and_retention"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="imported_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="run",
            name="imported",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
