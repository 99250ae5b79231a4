from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agentrun", "0014_run_imported"),
    ]

    operations = [
        migrations.AddField(
            model_name="snapshot",
            name="paths",
            field=models.TextField(blank=True, default=""),
        ),
    ]
