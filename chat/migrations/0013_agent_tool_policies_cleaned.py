"""Agents' tool policies as runs read them: only "auto", "ask" or "deny" per tool.

Before the admin's per-tool selects, policies were raw JSON and took anything; a value
a run cannot read ("sometimes") made every run of the agent fail at its start. Such
values are dropped (the tool's default applies), "ASK " becomes "ask", and a value that
is not a JSON object becomes an empty one.
"""

from django.db import migrations

VALID = {"auto", "ask", "deny"}


def clean_policies(apps, schema_editor):
    Agent = apps.get_model("chat", "Agent")
    for agent in Agent.objects.all():
        raw = agent.tool_policies
        cleaned = {}
        if isinstance(raw, dict):
            for name, value in raw.items():
                policy = value.strip().lower() if isinstance(value, str) else ""
                if isinstance(name, str) and policy in VALID:
                    cleaned[name] = policy
        if cleaned != raw:
            agent.tool_policies = cleaned
            agent.save(update_fields=["tool_policies"])


class Migration(migrations.Migration):
    dependencies = [("chat", "0012_search_vector_column")]

    operations = [migrations.RunPython(clean_policies, migrations.RunPython.noop)]
