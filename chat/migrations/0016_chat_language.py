from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0015_chat_event_branch_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="chatsession",
            name="language",
            field=models.CharField(blank=True, default="", max_length=16),
        ),
    ]
