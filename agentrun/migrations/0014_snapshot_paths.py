from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agentrun", "0013_pins_and_retention"),
    ]

    operations = [
        migrations.AddField(
            model_name="snapshot",
            name="paths",
            field=models.TextField(blank=True, default=""),
        ),
    ]
