"""PostgreSQL search reads a stored tsvector column instead of recomputing the expression.

The expression index of 0010 gave the planner no statistics (a partial index's are not
used), so it guessed ten matches for any word and joined every match to its chat one by
one; rechecking a row recomputed ``to_tsvector``. A stored generated column has real
statistics (common words walk the newest events and stop at the limit, rare ones use the
index) and costs one ``to_tsvector`` per message, at insert, as the index did.

Adding the column rewrites ``chat_chatevent`` once, under a lock: on a large database
this migration takes a while. SQLite keeps its FTS5 table (0010).
"""

from django.db import migrations

POSTGRES_UP = [
    """ALTER TABLE chat_chatevent ADD COLUMN search_vector tsvector
       GENERATED ALWAYS AS (
         CASE WHEN channel = 'display' AND kind = 'msg'
                   AND payload->>'role' IN ('user', 'assistant')
              THEN to_tsvector('simple', coalesce(payload->>'content', ''))
         END
       ) STORED""",
    # Rare words are estimated from the most common elements: more of them, closer guesses.
    "ALTER TABLE chat_chatevent ALTER COLUMN search_vector SET STATISTICS 1000",
    """CREATE INDEX chat_event_search_vector ON chat_chatevent
       USING GIN (search_vector) WHERE search_vector IS NOT NULL""",
    "DROP INDEX IF EXISTS chat_event_message_fts",
    "ANALYZE chat_chatevent",
]
POSTGRES_DOWN = [
    """CREATE INDEX chat_event_message_fts ON chat_chatevent
       USING GIN (to_tsvector('simple', coalesce(payload->>'content', '')))
       WHERE channel = 'display' AND kind = 'msg'""",
    "DROP INDEX IF EXISTS chat_event_search_vector",
    "ALTER TABLE chat_chatevent DROP COLUMN IF EXISTS search_vector",
]


def _postgres(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            for statement in statements:
                schema_editor.execute(statement)

    return run


class Migration(migrations.Migration):
    dependencies = [("chat", "0011_run_redispatched")]

    operations = [migrations.RunPython(_postgres(POSTGRES_UP), _postgres(POSTGRES_DOWN))]
