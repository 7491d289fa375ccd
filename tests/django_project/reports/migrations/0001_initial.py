from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="ReportRun",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("day", models.CharField(max_length=10)),
                ("started", models.DateTimeField()),
                ("finished", models.DateTimeField(null=True)),
            ],
        ),
    ]
