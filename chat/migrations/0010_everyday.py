"""Pinned chats, and full-text search over messages: SQLite FTS5 kept by triggers, or a
GIN index of the messages' text on PostgreSQL (chat/search.py reads both)."""

from django.db import migrations, models

SQLITE_UP = [
    "CREATE VIRTUAL TABLE chat_message_fts USING fts5(content, tokenize='unicode61')",
    """CREATE TRIGGER chat_message_fts_insert AFTER INSERT ON chat_chatevent
       WHEN new.channel = 'display' AND new.kind = 'msg'
        AND json_extract(new.payload, '$.role') IN ('user', 'assistant')
        AND coalesce(json_extract(new.payload, '$.content'), '') != ''
       BEGIN
         INSERT INTO chat_message_fts(rowid, content)
         VALUES (new.id, json_extract(new.payload, '$.content'));
       END""",
    """CREATE TRIGGER chat_message_fts_delete AFTER DELETE ON chat_chatevent
       WHEN old.channel = 'display' AND old.kind = 'msg'
       BEGIN
         DELETE FROM chat_message_fts WHERE rowid = old.id;
       END""",
    """INSERT INTO chat_message_fts(rowid, content)
       SELECT id, json_extract(payload, '$.content') FROM chat_chatevent
       WHERE channel = 'display' AND kind = 'msg'
         AND json_extract(payload, '$.role') IN ('user', 'assistant')
         AND coalesce(json_extract(payload, '$.content'), '') != ''""",
]
SQLITE_DOWN = [
    "DROP TRIGGER IF EXISTS chat_message_fts_delete",
    "DROP TRIGGER IF EXISTS chat_message_fts_insert",
    "DROP TABLE IF EXISTS chat_message_fts",
]
POSTGRES_UP = [
    """CREATE INDEX chat_event_message_fts ON chat_chatevent
       USING GIN (to_tsvector('simple', coalesce(payload->>'content', '')))
       WHERE channel = 'display' AND kind = 'msg'""",
]
POSTGRES_DOWN = ["DROP INDEX IF EXISTS chat_event_message_fts"]


def _on(vendor, statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == vendor:
            for statement in statements:
                schema_editor.execute(statement)

    return run


class Migration(migrations.Migration):
    dependencies = [("chat", "0009_relay")]

    operations = [
        migrations.AddField(
            model_name="chatsession",
            name="pinned_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(_on("sqlite", SQLITE_UP), _on("sqlite", SQLITE_DOWN)),
        migrations.RunPython(
            _on("postgresql", POSTGRES_UP), _on("postgresql", POSTGRES_DOWN)
        ),
    ]
