from django.db import migrations

DEFAULT_PROMPT = (
    "You are Lyceum's assistant: helpful, precise and friendly. Answer in Markdown. "
    "Use your tools when they help: calculator for arithmetic, current_time for the date, "
    "the file tools to write, edit, read and list files in this chat's workspace, and "
    "delegate to hand a self-contained task to a sub-agent."
)
TOOLS = [
    "calculator",
    "current_time",
    "write_file",
    "edit_file",
    "read_file",
    "list_files",
    "delegate",
]


def create_default_agent(apps, schema_editor):
    Agent = apps.get_model("chat", "Agent")
    if not Agent.objects.filter(is_default=True).exists():
        Agent.objects.create(
            name="Assistant",
            slug="assistant",
            system_prompt=DEFAULT_PROMPT,
            default_model="",
            tools=TOOLS,
            tool_policies={},
            max_rounds=12,
            is_default=True,
        )


class Migration(migrations.Migration):
    dependencies = [("chat", "0002_runtime")]
    operations = [migrations.RunPython(create_default_agent, migrations.RunPython.noop)]
